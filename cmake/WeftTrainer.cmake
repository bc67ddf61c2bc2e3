# Trainer binaries and the programs beside them (weft-plan, weft-export) from one list of model
# families. A family named `name` is the type weft::name::Family in the header
# weft/models/name/family.hpp (include/weft/models/<name>/, or any include directory of the target);
# where weft/models/name/run_plan.hpp or cluster_plan.hpp exist (a plan in closed form), the trainer's
# main or weft-plan includes them.
#
#   weft_add_trainer(weft_train SOURCES weft_train.cpp FAMILIES gpt2 llama
#                    [CUDA_FAMILIES gpt2 llama] [PRECISIONS f32 bf16 f64] [NO_CONTEXT] [GEMM_IN_UNITS])
#   weft_add_family_program(weft_plan SOURCES weft_plan.cpp FAMILIES gpt2 llama [HEADER cluster_plan.hpp])
#
# weft_add_trainer writes the loop's explicit instantiations (weft/train/unit.hpp): a source file
# per family on the host and one on the GPU (CUDA_FAMILIES, in builds with a CUDA compiler), each
# holding the family's two units (with and without sequence parallelism: every variant, strategy and
# precision of the family that the build keeps). The two share most of their code, which a file of
# its own for each would compile again (docs/performance.md has the times). It writes two headers into the target's include path: weft_units.hpp (the families and the
# Unit types, which each unit includes) and weft_trainer.hpp (for main: weft/train/main.hpp, the
# units' extern declarations, and `weft_units::units`, the list to give train::main_of). PRECISIONS
# keeps only those precisions (default: every one a variant runs in); NO_CONTEXT leaves out the
# context-parallel variants (--context is then refused by name); GEMM_IN_UNITS compiles the host
# GEMM's Eigen code in the first host unit instead of linking weft::host_gemm (a library is built
# before any unit of the binary starts, on one core). scripts/gpu-build writes the same files
# through weft_trainer_sources (cmake -P cmake/WeftTrainerSources.cmake).
#
# weft_add_family_program writes weft_families.hpp (`weft_units::families`, a train::List of the
# families, their headers and HEADER where it exists) for a program that takes a list of families.

set(WEFT_TRAINER_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/WeftTrainerSources.cmake)

function(weft_add_trainer target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_CONTEXT;GEMM_IN_UNITS" "" "SOURCES;FAMILIES;CUDA_FAMILIES;PRECISIONS")
  if(NOT arg_FAMILIES)
    message(FATAL_ERROR "weft_add_trainer(${target}): no FAMILIES; name at least one model family (gpt2, llama, ...)")
  endif()
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${target}_units)
  set(cuda_families "")
  if(WEFT_HAS_CUDA)
    set(cuda_families ${arg_CUDA_FAMILIES})
  endif()
  set(options "")
  if(arg_NO_CONTEXT)
    list(APPEND options NO_CONTEXT)
  endif()
  if(arg_GEMM_IN_UNITS)
    list(APPEND options GEMM_IN_UNITS)
  endif()
  weft_trainer_sources(${dir} FAMILIES ${arg_FAMILIES} CUDA_FAMILIES ${cuda_families} PRECISIONS ${arg_PRECISIONS}
                       ${options} OUT units)
  add_executable(${target} ${arg_SOURCES} ${units})
  target_include_directories(${target} PRIVATE ${dir})
  if(arg_GEMM_IN_UNITS)  # not weft::host_gemm, which weft's own directory links to every target
    set_property(TARGET ${target} PROPERTY LINK_LIBRARIES "")
    target_compile_definitions(${target} PRIVATE WEFT_HOST_GEMM_COMPILED=1)
  endif()
endfunction()

function(weft_add_family_program target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "HEADER" "SOURCES;FAMILIES")
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${target}_families)
  weft_family_list_header(${dir}/weft_families.hpp "${arg_FAMILIES}" "${arg_HEADER}")
  add_executable(${target} ${arg_SOURCES})
  target_include_directories(${target} PRIVATE ${dir})
endfunction()
