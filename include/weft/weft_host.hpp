// weft for hosts without CUDA: everything that builds with a plain C++20 compiler and Eigen.
#pragma once

#include "weft/comm/communicator.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/core/bf16.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/core/philox.hpp"
#include "weft/core/shape.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/layout/layout.hpp"
#include "weft/layout/placement.hpp"
#include "weft/layout/plan.hpp"
#include "weft/layout/redistribute.hpp"
#include "weft/tensor/tensor.hpp"
#include "weft/version.hpp"
