# Source checks that keep the library's layers pointing one way, run as CTest cases:
#   cmake -DSOURCE_DIR=<repository> -DCHECK=<name> -P tests/check_layering.cmake
# CHECK=train_includes: no file of lib/cuda, lib/grid, lib/comm, lib/model or lib/runtime
#   includes a header of lib/train/ (the trainer sits above them; what they share with it lives
#   in lib/runtime/ and lib/grid/).
# CHECK=test_hooks: no file under lib/ or app/ but lib/util/test_hooks.* names a TRIDENT_TEST_*
#   variable in a string (to read it itself): every hook is read through the registry
#   lib/util/test_hooks.hpp, which lists them and says what each is for.
# A violation fails with one line per offending include or read (file:line: text).
cmake_minimum_required(VERSION 3.20)

function(scan dirs pattern exempt out)
  set(found "")
  foreach(dir ${dirs})
    file(GLOB_RECURSE files "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.cpp"
         "${SOURCE_DIR}/${dir}/*.cu" "${SOURCE_DIR}/${dir}/*.cuh" "${SOURCE_DIR}/${dir}/*.h")
    foreach(f ${files})
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
      if(rel IN_LIST exempt)
        continue()
      endif()
      file(STRINGS "${f}" lines)
      set(n 0)
      foreach(line IN LISTS lines)
        math(EXPR n "${n} + 1")
        if(line MATCHES "${pattern}")
          string(APPEND found "${rel}:${n}: ${line}\n")
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

if(NOT DEFINED SOURCE_DIR OR NOT IS_DIRECTORY "${SOURCE_DIR}/lib")
  message(FATAL_ERROR "check_layering.cmake: SOURCE_DIR='${SOURCE_DIR}' is not the repository")
endif()
if(CHECK STREQUAL "train_includes")
  scan("lib/cuda;lib/grid;lib/comm;lib/model;lib/runtime" "^[ \t]*#[ \t]*include[ \t]*[\"<]train/"
       "" found)
  set(rule "lib/cuda, lib/grid, lib/comm, lib/model and lib/runtime must not include lib/train/")
elseif(CHECK STREQUAL "test_hooks")
  scan("lib;app" "\"TRIDENT_TEST_" "lib/util/test_hooks.cpp;lib/util/test_hooks.hpp"
       found)
  set(rule "TRIDENT_TEST_* hooks are read through lib/util/test_hooks.hpp only")
else()
  message(FATAL_ERROR "check_layering.cmake: unknown CHECK='${CHECK}'")
endif()
if(found)
  message(FATAL_ERROR "${rule}:\n${found}")
endif()
message(STATUS "${CHECK}: ok")
