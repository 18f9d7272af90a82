# tenplex_optimize_hot(TARGET OUT): in a sanitized build (TENPLEX_SANITIZE, scripts/test.sh's
# at -O0), TARGET of a module named in TENPLEX_SANITIZE_O1 (its library and its unit tests)
# is compiled at -O1: the brute-force references of those modules' tests ran ~3x longer at
# -O0 under ASan+UBSan (policy, layout, planner, reshard: ~1700 of the 2400 s of CPU of the
# clean-clone CI's sanitized unit tests). OUT is set to whether it is.
set(TENPLEX_SANITIZE_O1 "" CACHE STRING "Modules compiled at -O1 in a sanitized build")
function(tenplex_optimize_hot target out)
  string(REGEX REPLACE "^tenplex_([a-z0-9]+)(_test)?$" "\\1" module ${target})
  set(${out} FALSE PARENT_SCOPE)
  if(TENPLEX_SANITIZE AND module IN_LIST TENPLEX_SANITIZE_O1)
    target_compile_options(${target} PRIVATE -O1)
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# tenplex_library(NAME SOURCES a.cc b.cc DEPS x y) builds the static library NAME from
# the given sources of the current directory (position independent, the shared
# precompiled header): a library split out of a module (tenplex_module's EXCLUDE).
function(tenplex_library name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${L_DEPS})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  # One precompiled header (util/pch.h) for all libraries, built with tenplex_util's
  # flags; each test executable (other flags: not PIC) builds its own with gtest added.
  # It halves the build on 2 cores (scripts/demo.sh builds the CLI within its budget).
  tenplex_optimize_hot(${name} hot)
  if(TENPLEX_PCH)
    if(name STREQUAL "tenplex_util")
      target_precompile_headers(tenplex_util PRIVATE ${PROJECT_SOURCE_DIR}/src/tenplex/util/pch.h)
    elseif(hot)
      # Its own flags (-O1): clang refuses a precompiled header built without them.
      target_precompile_headers(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src/tenplex/util/pch.h)
    else()
      target_precompile_headers(${name} REUSE_FROM tenplex_util)
    endif()
  endif()
endfunction()

# tenplex_module(NAME DEPS a b c [EXCLUDE x.cc ...]) builds src/tenplex/NAME/*.cc (except
# *_test.cc, *_main.cc and the EXCLUDE files, which another library of the directory
# builds) into the static library tenplex_NAME and *_test.cc into tenplex_NAME_test.
function(tenplex_module name)
  cmake_parse_arguments(M "" "" "DEPS;TEST_DEPS;EXCLUDE" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  file(GLOB tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cc)
  list(FILTER srcs EXCLUDE REGEX "(_test|_main|_fuzz)\\.cc$")
  foreach(x ${M_EXCLUDE})
    list(REMOVE_ITEM srcs ${CMAKE_CURRENT_SOURCE_DIR}/${x})
  endforeach()
  tenplex_library(tenplex_${name} SOURCES ${srcs} DEPS ${M_DEPS})
  if(tests AND TENPLEX_UNIT_TESTS)
    add_executable(tenplex_${name}_test ${tests})
    target_link_libraries(tenplex_${name}_test PRIVATE tenplex_${name} ${M_TEST_DEPS} GTest::gtest GTest::gtest_main)
    tenplex_optimize_hot(tenplex_${name}_test hot)
    if(TENPLEX_PCH)
      target_precompile_headers(tenplex_${name}_test PRIVATE ${PROJECT_SOURCE_DIR}/src/tenplex/util/pch.h
                                <gtest/gtest.h>)
    endif()
    gtest_discover_tests(tenplex_${name}_test DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
  endif()
  # libFuzzer targets: *_fuzz.cc become tenplex_NAME_<file> with -DTENPLEX_FUZZ=ON (clang).
  if(TENPLEX_FUZZ)
    file(GLOB fuzzers CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_fuzz.cc)
    foreach(f ${fuzzers})
      get_filename_component(fname ${f} NAME_WE)
      add_executable(tenplex_${name}_${fname} ${f})
      target_link_libraries(tenplex_${name}_${fname} PRIVATE tenplex_${name})
      target_link_options(tenplex_${name}_${fname} PRIVATE -fsanitize=fuzzer)
    endforeach()
  endif()
endfunction()
