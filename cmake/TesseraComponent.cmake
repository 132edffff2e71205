# TesseraComponent.cmake: the one helper that creates every component library and test binary.
#
#   tessera_add_component(<name> SOURCES <src>... [DEPS <target>...])
#       -> static library tessera_<name>, alias tessera::<name>. Includes are repo-rooted.
#   tessera_add_test(<name> SOURCES <src>... [DEPS <target>...] LABELS <label>...)
#       -> executable bin/<name>, registered as one ctest entry with the labels
#          (unit | integration | slow | gpu) and the environment TESSERA_SOURCE_DIR,
#          TESSERA_SHARED_DIR (golden fixtures), TESSERA_BIN_DIR, OMP_NUM_THREADS=1 and
#          TESSERA_MALLOC (the configured allocator).
#   tessera_add_bench(<name> SOURCES <src>... [DEPS <target>...])
#       -> Google Benchmark executable bin/<name>, run by bench/run.
# Executables also link tessera_malloc (Note [Allocator] in the top CMakeLists.txt).
#
# Every C++ target links the same third-party set (tessera_deps) and reuses one precompiled
# header (LibTorch + CAF). Identical flags everywhere are what make REUSE_FROM valid.

set(TESSERA_SHARED_DIR "${CMAKE_SOURCE_DIR}/../shared" CACHE PATH "The shared/ folder (golden fixtures)")

function(tessera_setup_pch)
  add_library(tessera_deps INTERFACE)
  target_link_libraries(tessera_deps INTERFACE
    ${TORCH_LIBRARIES} CAF::core CAF::io CapnProto::capnp CapnProto::kj Boost::headers
    nlohmann_json::nlohmann_json yaml-cpp spdlog::spdlog fmt::fmt CLI11::CLI11
    PkgConfig::PCRE2 PNG::PNG ${READLINE_LIBRARY} Threads::Threads)
  target_include_directories(tessera_deps INTERFACE ${CMAKE_SOURCE_DIR})
  target_compile_options(tessera_deps INTERFACE -fPIC -Wall -Wextra -Wno-unused-parameter -Winvalid-pch)
  if(TESSERA_WITH_CUDA)
    target_link_libraries(tessera_deps INTERFACE tessera::nccl)
    target_compile_definitions(tessera_deps INTERFACE TESSERA_WITH_CUDA=1)
  endif()
  if(TESSERA_BUILD_TESTS)
    target_link_libraries(tessera_deps INTERFACE GTest::gtest)
  endif()

  set(stub ${CMAKE_BINARY_DIR}/tessera_pch.cpp)
  if(NOT EXISTS ${stub})
    file(WRITE ${stub} "// Host translation unit for the shared precompiled header.\n")
  endif()
  add_library(tessera_pch STATIC ${stub})
  target_link_libraries(tessera_pch PUBLIC tessera_deps)
  target_precompile_headers(tessera_pch PUBLIC
    <torch/torch.h> <caf/all.hpp> <caf/io/all.hpp> <nlohmann/json.hpp> <fmt/format.h>)
endfunction()

function(_tessera_target_common tgt)
  target_link_libraries(${tgt} PUBLIC tessera_deps)
  target_precompile_headers(${tgt} REUSE_FROM tessera_pch)
endfunction()

function(tessera_add_component name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(tgt tessera_${name})
  add_library(${tgt} STATIC ${ARG_SOURCES})
  add_library(tessera::${name} ALIAS ${tgt})
  _tessera_target_common(${tgt})
  if(ARG_DEPS)
    target_link_libraries(${tgt} PUBLIC ${ARG_DEPS})
  endif()
endfunction()

function(tessera_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    message(FATAL_ERROR "tessera_add_test(${name}): LABELS is required (unit|integration|slow|gpu)")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  _tessera_target_common(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest_main GTest::gmock tessera_malloc)
  # One ctest entry per binary: every process start loads LibTorch (~0.5 s of CPU), so one
  # process per GoogleTest case would cost more than most of our tests. ctest -j runs binaries
  # in parallel; --output-on-failure shows the failing cases.
  add_test(NAME ${name} COMMAND ${name} --gtest_color=no)
  set_tests_properties(${name} PROPERTIES
    LABELS "${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "TESSERA_SOURCE_DIR=${CMAKE_SOURCE_DIR};TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR};TESSERA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;OMP_NUM_THREADS=1;TESSERA_MALLOC=${TESSERA_MALLOC}")
endfunction()

function(tessera_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  _tessera_target_common(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} benchmark::benchmark tessera_malloc)
endfunction()
