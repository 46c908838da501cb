# Runs tests/distributed/failure_main.cpp's program as a job of RANKS ranks whose last rank fails (HOW:
# throw or kill) and checks that the job ends within a bounded time with a nonzero status, the
# failing rank's message (for throw) and, from every other rank, that it stopped because another
# rank failed. Called by ctest with -DMPIEXEC= -DPROGRAM= -DRANKS= -DHOW=.
execute_process(COMMAND ${MPIEXEC} --oversubscribe -np ${RANKS} ${PROGRAM} ${HOW}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 60)
message("${out}")
if(status MATCHES "timeout|Process terminated due to timeout")
  message(FATAL_ERROR "the job did not end within 60 s of one rank's failure (${HOW}): it hangs")
endif()
if(status EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although rank ${RANKS}-1 failed")
endif()
math(EXPR last "${RANKS} - 1")
if(HOW STREQUAL "throw" AND NOT out MATCHES "qkv: rank ${last} of ${RANKS}: injected failure on the last rank")
  message(FATAL_ERROR "the failing rank's message is missing")
endif()
foreach(rank RANGE 0 ${last})
  if(rank EQUAL last)
    continue()
  endif()
  if(NOT out MATCHES "qkv: rank ${rank} of ${RANKS}: stopped, because another rank of the job failed")
    message(FATAL_ERROR "rank ${rank} did not say why it stopped")
  endif()
endforeach()
