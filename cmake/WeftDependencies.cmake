# Host dependencies of weft::weft, from Debian's packages (libeigen3-dev).
find_package(Threads REQUIRED)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
