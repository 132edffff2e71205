# TesseraComponent.cmake: the one helper that creates every component library and test binary.
#
#   tessera_add_component(<name> SOURCES <src>... [DEPS <target>...])
#       -> static library tessera_<name>, alias tessera::<name>. Includes are repo-rooted.
#   tessera_add_test(<name> SOURCES <src>... [DEPS <target>...] LABELS <label>...)
#       -> executable bin/<name>, registered as one ctest entry with the labels
#          (unit | integration | slow | gpu) and the environment TESSERA_SOURCE_DIR,
#          TESSERA_SHARED_DIR (golden fixtures), TESSERA_BIN_DIR, OMP_NUM_THREADS=1,
#          TESSERA_MALLOC (the configured allocator) and TESSERA_PYTHON (reference Python).
#   tessera_add_bench(<name> SOURCES <src>... [DEPS <target>...])
#       -> Google Benchmark executable bin/<name>, run by bench/run.
#   tessera_add_cuda_kernels(<name> SOURCES <src.cu>...)
#       -> with TESSERA_WITH_CUDA, static library tessera_<name>_cuda of the component's kernels,
#          linked privately into tessera_<name> (Note [CUDA kernels] in the top CMakeLists.txt).
# Executables also link tessera_malloc (Note [Allocator] in the top CMakeLists.txt).
#
# Every C++ target links the same third-party set (tessera_deps) and reuses one precompiled
# header (LibTorch + CAF). Identical flags everywhere are what make REUSE_FROM valid.

set(TESSERA_SHARED_DIR "${CMAKE_SOURCE_DIR}/../shared" CACHE PATH "The shared/ folder (golden fixtures)")
set(TESSERA_PYTHON "python3" CACHE STRING "Python with torch and transformers, for the reference tests")

# LibTorch 2.x ships fmt headers of its own (fmt 12) in its include dir, which precedes
# /usr/include; Tessera and Debian's spdlog are built against Debian's fmt (libfmt.so.9). A link
# to the system fmt headers, searched as -I (before any -isystem dir), keeps one fmt.
function(_tessera_pin_fmt_headers)
  get_target_property(fmt_dirs fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  set(fmt_dir "")
  foreach(d IN LISTS fmt_dirs ITEMS /usr/include)
    if(NOT fmt_dir AND EXISTS "${d}/fmt/format.h")
      set(fmt_dir "${d}")
    endif()
  endforeach()
  set(link_root ${CMAKE_BINARY_DIR}/fmt-include)
  file(MAKE_DIRECTORY ${link_root})
  file(CREATE_LINK "${fmt_dir}/fmt" "${link_root}/fmt" SYMBOLIC)
  target_include_directories(tessera_deps BEFORE INTERFACE ${link_root})
endfunction()

function(tessera_setup_pch)
  add_library(tessera_deps INTERFACE)
  target_link_libraries(tessera_deps INTERFACE
    ${TORCH_LIBRARIES} CAF::core CAF::io CapnProto::capnp CapnProto::kj Boost::headers
    nlohmann_json::nlohmann_json yaml-cpp spdlog::spdlog fmt::fmt CLI11::CLI11
    PkgConfig::PCRE2 ${READLINE_LIBRARY} Threads::Threads)
  target_include_directories(tessera_deps INTERFACE ${CMAKE_SOURCE_DIR})
  _tessera_pin_fmt_headers()
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

# Note [Shared PCH]: the precompiled header holds <torch/torch.h> (LibTorch 2.x: ~0.8 GB). A TU
# that includes <torch/torch.h> itself compiles in ~20 s with it instead of ~40 s without; a TU
# that does not (headers keep <torch/torch.h> out, tests/layering checks it) compiles in ~10 s
# without it and ~20 s with it, the load of the header being most of that. So the sources whose
# own text includes <torch/torch.h> use the PCH, and the others skip it and get the PCH's other
# headers (CAF, JSON, fmt) by -include instead, so both kinds see the same declarations. A file
# that changes its includes only compiles faster or slower until the next configure.
function(_tessera_target_common tgt)
  target_link_libraries(${tgt} PUBLIC tessera_deps)
  target_precompile_headers(${tgt} REUSE_FROM tessera_pch)
  get_target_property(sources ${tgt} SOURCES)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    if(IS_ABSOLUTE "${src}")
      set(path "${src}")
    else()
      get_target_property(dir ${tgt} SOURCE_DIR)
      set(path "${dir}/${src}")
    endif()
    if(NOT EXISTS "${path}")
      continue()  # generated later (capnp, config defaults): no LibTorch in them
    endif()
    file(STRINGS "${path}" torch_includes REGEX "#include <torch/torch.h>")
    if(NOT torch_includes)
      set_source_files_properties("${path}" TARGET_DIRECTORY ${tgt} PROPERTIES SKIP_PRECOMPILE_HEADERS ON
        COMPILE_OPTIONS "-include;caf/all.hpp;-include;caf/io/all.hpp;-include;nlohmann/json.hpp;-include;fmt/format.h")
    endif()
  endforeach()
endfunction()

# Note [libstdc++ first]: PyPI's libtorch.so exports its own copies of libstdc++'s
# std::filesystem functions, built against another libstdc++; a binary that resolves
# std::filesystem::remove_all to that copy jumps to a null pointer. The dynamic linker takes the
# first definition in DT_NEEDED order, and the compiler appends libstdc++ after every library, so
# every executable names libstdc++ first.
function(_tessera_executable_link tgt)
  target_link_options(${tgt} BEFORE PRIVATE "SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
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
  _tessera_executable_link(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest_main GTest::gmock tessera_malloc)
  # One ctest entry per binary: every process start loads LibTorch (~0.5 s of CPU), so one
  # process per GoogleTest case would cost more than most of our tests. ctest -j runs binaries
  # in parallel; --output-on-failure shows the failing cases.
  add_test(NAME ${name} COMMAND ${name} --gtest_color=no)
  set_tests_properties(${name} PROPERTIES
    LABELS "${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "TESSERA_SOURCE_DIR=${CMAKE_SOURCE_DIR};TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR};TESSERA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;OMP_NUM_THREADS=1;TESSERA_MALLOC=${TESSERA_MALLOC};TESSERA_PYTHON=${TESSERA_PYTHON}")
endfunction()

function(tessera_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  _tessera_target_common(${name})
  _tessera_executable_link(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} benchmark::benchmark tessera_malloc)
endfunction()

# The .cu files include CUDA's headers and repo-rooted ones only, never LibTorch's.
function(tessera_add_cuda_kernels name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  if(NOT TESSERA_WITH_CUDA)
    return()
  endif()
  set(tgt tessera_${name}_cuda)
  add_library(${tgt} STATIC ${ARG_SOURCES})
  target_include_directories(${tgt} PRIVATE ${CMAKE_SOURCE_DIR})
  set_target_properties(${tgt} PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(tessera_${name} PRIVATE ${tgt} CUDA::cudart)
endfunction()

# Note [Include-free libraries] (CMakeLists.txt): `dir` goes on `tgt`'s include path only where it
# is not one the compiler searches anyway (a private prefix, as on the GPU image).
function(tessera_private_include tgt dir)
  if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    target_include_directories(${tgt} SYSTEM PRIVATE ${dir})
  endif()
endfunction()
