# cmake -DFILE=<ELF file> -DRUNPATH=<run path> -P set_runpath.cmake: sets FILE's run path to
# RUNPATH, or removes it when RUNPATH is empty (setup.py: Note [packaged run paths]).
if(RUNPATH STREQUAL "")
  file(RPATH_REMOVE FILE "${FILE}")
else()
  file(RPATH_SET FILE "${FILE}" NEW_RPATH "${RUNPATH}")
endif()
