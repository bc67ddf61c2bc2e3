# weft_compile_fail(NAME name SOURCE file [DEFINE macros...] [COMPILER c++] [INCLUDES dirs...] EXPECT text...)
#
# A CTest test that compiles SOURCE with -DMACRO (syntax only, C++20, weft's include directory) and passes only if the compiler fails and its output contains every EXPECT
# text (literal, not a regex). With DEFINE omitted it must compile instead: the control case.
# COMPILER: another compiler than WEFT_COMPILE_FAIL_CXX, for a message only it words well.
set(WEFT_COMPILE_FAIL_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/compile_fail.cmake)
# The EXPECT texts spell types as GCC prints them ("Shard<0> >", defaulted arguments left out): where
# the build compiles with clang (the dev preset), these tests compile with g++ if it is installed.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  find_program(WEFT_COMPILE_FAIL_CXX NAMES g++)
endif()
if(NOT WEFT_COMPILE_FAIL_CXX)
  set(WEFT_COMPILE_FAIL_CXX ${CMAKE_CXX_COMPILER})
endif()

function(weft_compile_fail)
  cmake_parse_arguments(CF "" "NAME;SOURCE;COMPILER" "DEFINE;EXPECT;INCLUDES" ${ARGN})
  set(flags -std=c++20 -fsyntax-only -I${PROJECT_SOURCE_DIR}/include)
  foreach(dir IN LISTS CF_INCLUDES)
    list(APPEND flags -isystem ${dir})
  endforeach()
  if(CF_DEFINE)
    foreach(macro IN LISTS CF_DEFINE)
      list(APPEND flags -D${macro})
    endforeach()
    set(should_fail ON)
  else()
    set(should_fail OFF)
  endif()
  if(NOT CF_COMPILER)
    set(CF_COMPILER ${WEFT_COMPILE_FAIL_CXX})
  endif()
  string(REPLACE ";" "|" expect "${CF_EXPECT}")
  string(REPLACE ";" " " flags "${flags}")
  add_test(NAME ${CF_NAME}
    COMMAND ${CMAKE_COMMAND}
      -DCOMPILER=${CF_COMPILER}
      "-DFLAGS=${flags}"
      -DSOURCE=${CF_SOURCE}
      -DSHOULD_FAIL=${should_fail}
      "-DEXPECT=${expect}"
      -P ${WEFT_COMPILE_FAIL_SCRIPT})
  set_tests_properties(${CF_NAME} PROPERTIES LABELS "compile-fail" TIMEOUT 300)
endfunction()
