# FindCAF.cmake: the C++ Actor Framework (Debian's libcaf-dev ships no CMake package).
#
# Provides the imported targets CAF::core, CAF::io and (if found) CAF::openssl, and sets
# CAF_FOUND, CAF_INCLUDE_DIRS and CAF_VERSION.

find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY NAMES caf_core)
find_library(CAF_IO_LIBRARY NAMES caf_io)
find_library(CAF_OPENSSL_LIBRARY NAMES caf_openssl)

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_ver REGEX "#define CAF_VERSION [0-9]+")
  if(_caf_ver MATCHES "CAF_VERSION ([0-9]+)")
    math(EXPR _major "${CMAKE_MATCH_1} / 10000")
    math(EXPR _minor "(${CMAKE_MATCH_1} / 100) % 100")
    math(EXPR _patch "${CMAKE_MATCH_1} % 100")
    set(CAF_VERSION "${_major}.${_minor}.${_patch}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION)

if(CAF_FOUND)
  set(CAF_INCLUDE_DIRS ${CAF_INCLUDE_DIR})
  find_package(Threads REQUIRED)
  if(NOT TARGET CAF::core)
    add_library(CAF::core UNKNOWN IMPORTED)
    set_target_properties(CAF::core PROPERTIES
      IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES Threads::Threads)
  endif()
  if(NOT TARGET CAF::io)
    add_library(CAF::io UNKNOWN IMPORTED)
    set_target_properties(CAF::io PROPERTIES
      IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
  if(CAF_OPENSSL_LIBRARY AND NOT TARGET CAF::openssl)
    add_library(CAF::openssl UNKNOWN IMPORTED)
    set_target_properties(CAF::openssl PROPERTIES
      IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::io)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)
