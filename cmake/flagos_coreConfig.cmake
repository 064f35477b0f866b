# CMake package of an installed flagos-core, for plugins built out of tree:
#
#   find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
#   execute_process(COMMAND ${Python_EXECUTABLE} -c "import flagos_core; print(flagos_core.cmake_prefix_path())" ...)
#   find_package(flagos_core CONFIG REQUIRED)
#   target_link_libraries(my_plugin PRIVATE flagos::core)
#   flagos_plugin_build_info(${CMAKE_CURRENT_BINARY_DIR}/_build_info.py)
#
# flagos::core brings the core's headers and library and the torch that the
# build's Python imports (the core and its plugins must share one torch).

get_filename_component(_flagos_package "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT Python_EXECUTABLE)
  find_package(Python REQUIRED COMPONENTS Interpreter)
endif()
if(NOT TARGET torch_from_python)
  include("${CMAKE_CURRENT_LIST_DIR}/TorchFromPython.cmake")
endif()

file(STRINGS "${_flagos_package}/include/flagos/Export.h" _flagos_abi_line REGEX "kPluginAbiVersion = [0-9]+")
string(REGEX REPLACE ".*kPluginAbiVersion = ([0-9]+).*" "\\1" FLAGOS_PLUGIN_ABI_VERSION "${_flagos_abi_line}")

if(NOT TARGET flagos::core)
  add_library(flagos::core SHARED IMPORTED)
  set_target_properties(flagos::core PROPERTIES
    IMPORTED_LOCATION "${_flagos_package}/lib/libflagos_core.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_flagos_package}/include"
    INTERFACE_LINK_LIBRARIES torch_from_python)
endif()
set(flagos_core_FOUND TRUE)
message(STATUS "flagos: plugin ABI ${FLAGOS_PLUGIN_ABI_VERSION}, core at ${_flagos_package}")

# Writes the facts the core checks before loading a plugin's compiled code.
function(flagos_plugin_build_info output)
  file(WRITE "${output}"
    "# Written at build time: what this plugin's compiled code was built for.\n"
    "ABI_VERSION = ${FLAGOS_PLUGIN_ABI_VERSION}\n"
    "TORCH_VERSION = \"${TORCH_VERSION_STRING}\"\n")
endfunction()
