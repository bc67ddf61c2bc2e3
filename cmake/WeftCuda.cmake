# weft::cuda, when a CUDA compiler is found: weft::weft plus cudart, cuBLASLt and NCCL.
# Without one, weft::cuda is simply not defined (a status line says so); the host build is complete.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "weft: no CUDA compiler found; weft::cuda and the CUDA targets are not built")
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)  # H100/H200; the cuda preset and scripts/gpu-check use the same
endif()
enable_language(CUDA)
# The CUDA link libraries CMake found through nvcc's host compiler (GCC) under the build's linker
# flags include GCC's sanitizer runtimes (the dev preset's -fsanitize=address,undefined). weft's
# CUDA objects are not instrumented, and a clang-built C++ side links its own runtimes: two ASan
# runtimes in one program refuse to start, so GCC's are dropped there.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  list(REMOVE_ITEM CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES asan ubsan tsan)
endif()
find_package(CUDAToolkit REQUIRED)
find_library(WEFT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
             ${CUDAToolkit_LIBRARY_ROOT}/lib64)
find_path(WEFT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(NOT WEFT_NCCL_LIBRARY OR NOT WEFT_NCCL_INCLUDE_DIR)
  message(STATUS "weft: CUDA found but NCCL not found; weft::cuda is not built")
  return()
endif()

add_library(weft_cuda INTERFACE)
add_library(weft::cuda ALIAS weft_cuda)
set_target_properties(weft_cuda PROPERTIES EXPORT_NAME cuda)
target_link_libraries(weft_cuda INTERFACE weft::weft CUDA::cudart CUDA::cublasLt CUDA::cublas ${WEFT_NCCL_LIBRARY})
target_include_directories(weft_cuda INTERFACE ${WEFT_NCCL_INCLUDE_DIR})
target_compile_definitions(weft_cuda INTERFACE WEFT_ENABLE_CUDA=1)
# CMake 3.25 does not know CUDA 13's features (cuda_std_20), so the flag is spelled out.
target_compile_options(weft_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
set(WEFT_HAS_CUDA ON)
message(STATUS "weft: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${WEFT_NCCL_LIBRARY}")
