// TcpStore: the small key-value store that processes started by torchrun, Slurm or a script (the
// env launcher: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) use to meet before NCCL exists; weft
// shares the NCCL unique id through it (comm/nccl/bootstrap.cuh).
//
// Rank 0 serves it on MASTER_PORT (every interface) from a thread of its own; every rank, rank 0
// included, connects to MASTER_ADDR:MASTER_PORT as a client. set(key, bytes) stores a value; get(key)
// waits until some rank has set it. Rank 0's store serves only while it lives: end with barrier()
// so no rank still needs it. Every connect and every get gives up at the deadline with an
// Error naming the address, the key and the rank, so a rank that never comes is reported, not
// waited for. Values are at most 64 MiB; a malformed request closes that client's connection.
//
// Wire format (little-endian, as every machine weft runs on): a request is an op byte ('S' set,
// 'G' get), a u32 key length, the key, and for 'S' a u64 value length and the value; the server
// answers 'S' with one byte 'K' and 'G' with a u64 length and the value, once the key is set.
//
// This header is plain C++20 over POSIX sockets.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "weft/comm/launch.hpp"
#include "weft/core/error.hpp"

namespace weft {

class TcpStore {
 public:
  static constexpr std::uint64_t kMaxValue = std::uint64_t{64} << 20;

  // Rank `me.rank` of `me.world`; rank 0 also serves. Throws Error when rank 0 cannot listen on the
  // port, or this rank cannot connect within the deadline.
  TcpStore(const EnvRanks& me, std::chrono::milliseconds deadline = std::chrono::milliseconds(60'000))
      : me_(me), deadline_(deadline) {
    if (me.rank == 0) server_ = std::make_unique<Server>(me.master_port);
    connect_to_master();
  }
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;
  ~TcpStore() {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const std::string& value) {
    if (value.size() > kMaxValue)
      throw Error(where("set", key), cat("value of ", value.size(), " bytes"),
                  cat("store at most ", kMaxValue, " bytes"));
    std::string req = request('S', key);
    put_u64(req, value.size());
    req += value;
    send_all(req, "set", key);
    char ack = 0;
    recv_all(&ack, 1, "set", key);
    if (ack != 'K')
      throw Error(where("set", key), "the store did not acknowledge", "check MASTER_ADDR and MASTER_PORT");
  }

  // Waits until a rank has set `key`.
  std::string get(const std::string& key) {
    send_all(request('G', key), "get", key);
    unsigned char len[8];
    recv_all(len, 8, "get", key);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    if (n > kMaxValue) throw Error(where("get", key), cat("the store answered a length of ", n), "check MASTER_PORT");
    std::string value(n, '\0');
    recv_all(value.data(), n, "get", key);
    return value;
  }

  // Every rank sets "<name>/<rank>" and reads everyone's: returns when all ranks have arrived. Rank 0
  // (the server) also waits until every rank has finished reading, so its store outlives their gets.
  void barrier(const std::string& name) {
    set(cat(name, "/", me_.rank), "1");
    for (int r = 0; r < me_.world; ++r) (void)get(cat(name, "/", r));
    if (me_.rank != 0) set(cat(name, "/read/", me_.rank), "1");
    else
      for (int r = 1; r < me_.world; ++r) (void)get(cat(name, "/read/", r));
  }

 private:
  // The server: a thread polling the listening socket and every client; gets wait in `pending`.
  class Server {
   public:
    explicit Server(int port) {
      listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
      if (listen_ < 0) throw Error("TcpStore", cat("socket(): ", std::strerror(errno)), "check the system's limits");
      const int one = 1;
      ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_, 1024) != 0) {
        const std::string why = std::strerror(errno);
        ::close(listen_);
        throw Error("TcpStore (rank 0)", cat("cannot listen on port ", port, ": ", why),
                    "choose a free MASTER_PORT (another run may hold this one)");
      }
      thread_ = std::thread([this] { serve(); });
    }
    ~Server() {
      stop_ = true;
      thread_.join();
      for (auto& c : clients_) ::close(c.fd);
      ::close(listen_);
    }

   private:
    struct Client {
      int fd;
      std::string in;
    };
    void serve() {
      while (!stop_) {
        std::vector<pollfd> fds{{listen_, POLLIN, 0}};
        for (const auto& c : clients_) fds.push_back({c.fd, POLLIN, 0});
        if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
        if (fds[0].revents & POLLIN) {
          const int fd = ::accept(listen_, nullptr, nullptr);
          if (fd >= 0) clients_.push_back({fd, {}});
        }
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          Client& c = clients_[i - 1];
          char buf[65536];
          const ssize_t n = ::read(c.fd, buf, sizeof buf);
          if (n <= 0 || !handle(c, std::string_view(buf, static_cast<std::size_t>(n)))) {
            ::close(c.fd);
            c.fd = -1;
          }
        }
        std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
        answer_pending();
      }
    }
    // Parses whole requests from c's input; false on a malformed one.
    bool handle(Client& c, std::string_view bytes) {
      c.in.append(bytes);
      for (;;) {
        if (c.in.size() < 5) return true;
        const char op = c.in[0];
        const std::uint32_t klen = static_cast<std::uint32_t>(u64_at(c.in, 1, 4));
        if ((op != 'S' && op != 'G') || klen > 4096) return false;
        std::size_t need = 5 + klen;
        if (c.in.size() < need) return true;
        std::string key = c.in.substr(5, klen);
        if (op == 'G') {
          pending_.push_back({c.fd, std::move(key)});
          c.in.erase(0, need);
          continue;
        }
        if (c.in.size() < need + 8) return true;
        const std::uint64_t vlen = u64_at(c.in, need, 8);
        if (vlen > kMaxValue) return false;
        if (c.in.size() < need + 8 + vlen) return true;
        data_[key] = c.in.substr(need + 8, vlen);
        c.in.erase(0, need + 8 + vlen);
        if (!write_all(c.fd, "K", 1)) return false;
      }
    }
    void answer_pending() {
      std::erase_if(pending_, [&](const std::pair<int, std::string>& p) {
        const auto it = data_.find(p.second);
        if (it == data_.end()) return false;
        std::string out;
        put_u64(out, it->second.size());
        out += it->second;
        (void)write_all(p.first, out.data(), out.size());  // a client that left is dropped by poll
        return true;
      });
    }
    static std::uint64_t u64_at(const std::string& s, std::size_t at, int bytes) {
      std::uint64_t v = 0;
      for (int i = bytes - 1; i >= 0; --i)
        v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
      return v;
    }

    int listen_ = -1;
    std::atomic<bool> stop_{false};
    std::vector<Client> clients_;
    std::vector<std::pair<int, std::string>> pending_;  // (client fd, key) of gets not yet answered
    std::map<std::string, std::string> data_;
    std::thread thread_;
  };

  static void put_u64(std::string& s, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  static std::string request(char op, const std::string& key) {
    std::string r(1, op);
    const auto k = static_cast<std::uint32_t>(key.size());
    for (int i = 0; i < 4; ++i) r.push_back(static_cast<char>((k >> (8 * i)) & 0xff));
    return r + key;
  }
  static bool write_all(int fd, const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  std::string address() const { return cat(me_.master_addr, ":", me_.master_port); }
  std::string where(const char* op, const std::string& key) const {
    return cat("TcpStore ", op, " '", key, "' at ", address(), " from rank ", me_.rank);
  }

  void connect_to_master() {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(me_.master_port);
    if (const int rc = ::getaddrinfo(me_.master_addr.c_str(), port.c_str(), &hints, &res); rc != 0)
      throw Error(cat("TcpStore rank ", me_.rank),
                  cat("cannot resolve MASTER_ADDR '", me_.master_addr, "': ", gai_strerror(rc)),
                  "set MASTER_ADDR to rank 0's host name or address");
    const auto until = std::chrono::steady_clock::now() + deadline_;
    std::string last = "no attempt";
    while (std::chrono::steady_clock::now() < until) {
      fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd_ >= 0 && ::connect(fd_, res->ai_addr, res->ai_addrlen) == 0) break;
      last = std::strerror(errno);
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 may not listen yet
    }
    ::freeaddrinfo(res);
    if (fd_ < 0)
      throw Error(
          cat("TcpStore rank ", me_.rank),
          cat("could not connect to ", address(), " within the ", deadline_.count(), " ms deadline (", last, ")"),
          "start rank 0, and check MASTER_ADDR, MASTER_PORT and the firewall");
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  void send_all(const std::string& bytes, const char* op, const std::string& key) {
    if (!write_all(fd_, bytes.data(), bytes.size()))
      throw Error(where(op, key), cat("the connection failed: ", std::strerror(errno)),
                  "rank 0 (the store) has exited; see its error");
  }
  // Reads n bytes, waiting at most the deadline for them.
  void recv_all(void* out, std::size_t n, const char* op, const std::string& key) {
    auto* p = static_cast<char*>(out);
    const auto until = std::chrono::steady_clock::now() + deadline_;
    while (n > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      pollfd f{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&f, 1, static_cast<int>(left.count())) == 0)
        throw Error(where(op, key), cat("no answer within the ", deadline_.count(), " ms deadline"),
                    op == std::string("get") ? "the rank that sets this key has not come (or stalled); start every rank"
                                             : "rank 0 (the store) is stalled");
      const ssize_t r = ::recv(fd_, p, n, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error(where(op, key), "the store closed the connection", "rank 0 (the store) has exited; see its error");
      p += r;
      n -= static_cast<std::size_t>(r);
    }
  }

  EnvRanks me_;
  std::chrono::milliseconds deadline_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
};

}  // namespace weft
