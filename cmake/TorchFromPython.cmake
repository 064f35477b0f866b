# Finds the torch that the build's Python imports, without TorchConfig.cmake
# (which on CUDA builds insists on a CUDA toolkit the core does not need).
# Defines the interface targets torch_from_python and torch_python_from_python.

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env TORCH_DEVICE_BACKEND_AUTOLOAD=0 ${Python_EXECUTABLE} -c "
import os, torch, torchgen
root = os.path.dirname(torch.__file__)
print(os.path.join(root, 'include'))
print(os.path.join(root, 'include', 'torch', 'csrc', 'api', 'include'))
print(os.path.join(root, 'lib'))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(os.path.join(os.path.dirname(torchgen.__file__), 'packaged', 'ATen', 'native', 'native_functions.yaml'))
print(torch.__version__)
# The libstdc++ this process runs with (torch's): linking it by path keeps a
# toolchain that would fall back to the static libstdc++ from putting a second,
# uninitialised copy of it into the core (seen as crashes formatting numbers
# in error messages).
maps = open('/proc/self/maps').read().split()
print(next((p for p in maps if os.path.basename(p).startswith('libstdc++.so')), ''))"
  OUTPUT_VARIABLE _torch_info
  OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_result)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR "flagos: cannot import torch with ${Python_EXECUTABLE}; install torch first (and build with --no-build-isolation)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_INCLUDE)
list(GET _torch_info 1 TORCH_API_INCLUDE)
list(GET _torch_info 2 TORCH_LIB_DIR)
list(GET _torch_info 3 TORCH_CXX11_ABI)
list(GET _torch_info 4 TORCH_NATIVE_FUNCTIONS)
list(GET _torch_info 5 TORCH_VERSION_STRING)
list(LENGTH _torch_info _torch_info_length)
set(TORCH_LIBSTDCXX "")
if(_torch_info_length GREATER 6)
  list(GET _torch_info 6 TORCH_LIBSTDCXX)
endif()
message(STATUS "flagos: building against torch ${TORCH_VERSION_STRING} (${TORCH_LIB_DIR})")
# 2.9's c10::DeviceAllocator has no getMemoryInfo, which the core's memory
# reporting overrides: say so before the compiler does, less clearly.
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _torch_minor "${TORCH_VERSION_STRING}")
if(_torch_minor VERSION_LESS 2.10)
  message(FATAL_ERROR "flagos: torch ${TORCH_VERSION_STRING} is too old: flagos-core builds against torch 2.10 or newer "
                      "(pip install 'torch>=2.10')")
endif()

add_library(torch_from_python INTERFACE)
target_include_directories(torch_from_python INTERFACE ${TORCH_INCLUDE} ${TORCH_API_INCLUDE})
target_compile_definitions(torch_from_python INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
target_link_directories(torch_from_python INTERFACE ${TORCH_LIB_DIR})
target_link_libraries(torch_from_python INTERFACE c10 torch_cpu torch ${TORCH_LIBSTDCXX})
message(STATUS "flagos: C++ runtime ${TORCH_LIBSTDCXX}")

add_library(torch_python_from_python INTERFACE)
target_link_libraries(torch_python_from_python INTERFACE torch_from_python torch_python)
