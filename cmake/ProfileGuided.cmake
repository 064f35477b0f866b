# Profile-guided optimisation of libflagos_core (GCC).
#
# flagos's cost per call is mostly instruction-cache misses, not instructions:
# between two calls of one op a model runs dozens of others, so the per-call
# code (aliases, results, the typed kernels) is fetched anew every time, and
# without a profile GCC scatters each function's hot path between its rare
# branches. So the build makes an instrumented twin of the library and of the
# extension, runs cmake/profile_workload.py with them (a small transformer
# trained and decoded on the host runtime: the per-call path every provider
# shares), and compiles the real library with that profile: hot paths laid
# out together, rare branches moved aside. The profile is made fresh by every
# build, for the compiler and torch at hand; nothing is committed. In an
# incremental build the objects whose sources changed compile with the new
# profile and the others keep theirs (still valid for their unchanged code); a
# change to the workload alone takes effect in a clean build.
#
#   -DFLAGOS_PGO=OFF    builds without it (about half the build time)

option(FLAGOS_PGO "Optimise libflagos_core with a profile of a run on the host runtime (GCC only)" ON)

if(FLAGOS_PGO AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  message(STATUS "flagos: FLAGOS_PGO needs GCC (this is ${CMAKE_CXX_COMPILER_ID}); building without a profile")
elseif(FLAGOS_PGO)
  set(_stage ${CMAKE_CURRENT_BINARY_DIR}/profiling)
  flagos_core_library(flagos_core_profiling)
  flagos_core_extension(_C_profiling flagos_core_profiling)
  # The twin writes a .gcda file beside each of its objects when the run ends.
  # Functions are keyed in it by their order in the file: by default a local
  # function's key hashes its object's path, which differs between the twin
  # and the real library.
  set(_keys --param=profile-func-internal-id=1)
  set(_instrument -fprofile-generate -fprofile-update=prefer-atomic)
  target_compile_options(flagos_core_profiling PRIVATE ${_instrument} ${_keys})
  target_link_options(flagos_core_profiling PRIVATE ${_instrument})
  target_link_options(_C_profiling PRIVATE ${_instrument})
  # Staged as a package: <stage>/flagos_core/_C*.so and lib/libflagos_core.so.
  set_target_properties(flagos_core_profiling PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${_stage}/flagos_core/lib EXCLUDE_FROM_ALL ON)
  set_target_properties(_C_profiling PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${_stage}/flagos_core EXCLUDE_FROM_ALL ON)

  set(_profiled_objects ${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/flagos_core_profiling.dir)
  set(_optimised_objects ${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/flagos_core.dir)
  set(_stamp ${_stage}/profile.stamp)
  add_custom_command(
    OUTPUT ${_stamp}
    COMMAND ${CMAKE_COMMAND}
            -DPACKAGE_SOURCE=${CMAKE_CURRENT_SOURCE_DIR}/flagos_core -DSTAGE=${_stage}
            -DPYTHON=${Python_EXECUTABLE} -DWORKLOAD=${CMAKE_CURRENT_SOURCE_DIR}/cmake/profile_workload.py
            -DPROFILED_OBJECTS=${_profiled_objects} -DOPTIMISED_OBJECTS=${_optimised_objects} -DSTAMP=${_stamp}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/ProfileRun.cmake
    DEPENDS flagos_core_profiling _C_profiling ${CMAKE_CURRENT_SOURCE_DIR}/cmake/profile_workload.py
            ${CMAKE_CURRENT_SOURCE_DIR}/cmake/ProfileRun.cmake
    COMMENT "Profiling the instrumented flagos_core (cmake/profile_workload.py on the host runtime)")
  add_custom_target(flagos_core_profile DEPENDS ${_stamp})

  # The real library compiles after the run, with its profile; code the run
  # never reached is optimised as without a profile, not as cold.
  add_dependencies(flagos_core flagos_core_profile)
  target_compile_options(flagos_core PRIVATE -fprofile-use -fprofile-partial-training -Wno-missing-profile ${_keys})
  message(STATUS "flagos: profile-guided build of libflagos_core (FLAGOS_PGO=OFF builds without)")
endif()
