# Runs the profiling workload against the instrumented twin of flagos_core and
# hands its profile to the real library's objects (cmake -P, from
# ProfileGuided.cmake). GCC looks for an object's profile beside the object,
# under the object's own name, so each .gcda is copied from the twin's object
# tree to the same place in the real library's.

# Profiles of an earlier run would add up with this one's.
file(GLOB_RECURSE _old "${PROFILED_OBJECTS}/*.gcda")
if(_old)
  file(REMOVE ${_old})
endif()

# The package's Python files beside the staged binaries.
file(COPY "${PACKAGE_SOURCE}/" DESTINATION "${STAGE}/flagos_core" PATTERN "csrc" EXCLUDE PATTERN "__pycache__" EXCLUDE)

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${STAGE}" TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONDONTWRITEBYTECODE=1
          "${PYTHON}" "${WORKLOAD}"
  RESULT_VARIABLE _result
  OUTPUT_VARIABLE _output
  ERROR_VARIABLE _output)
if(NOT _result EQUAL 0)
  message(FATAL_ERROR "flagos: the profiling run (${WORKLOAD}) failed:\n${_output}\n"
                      "Build without profile-guided optimisation with -DFLAGOS_PGO=OFF "
                      "(pip: --config-settings=cmake.define.FLAGOS_PGO=OFF).")
endif()

file(GLOB_RECURSE _profiles RELATIVE "${PROFILED_OBJECTS}" "${PROFILED_OBJECTS}/*.gcda")
if(NOT _profiles)
  message(FATAL_ERROR "flagos: the profiling run wrote no profile under ${PROFILED_OBJECTS}")
endif()
foreach(_profile ${_profiles})
  get_filename_component(_dir "${OPTIMISED_OBJECTS}/${_profile}" DIRECTORY)
  file(MAKE_DIRECTORY "${_dir}")
  file(COPY_FILE "${PROFILED_OBJECTS}/${_profile}" "${OPTIMISED_OBJECTS}/${_profile}")
endforeach()
file(WRITE "${STAMP}" "${_output}")
