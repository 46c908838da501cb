// A job whose last rank fails while the others wait for it in a collective: "throw" (an error,
// reported as the qkv program reports one) or "kill" (the process dies). tests/distributed/
// check_failure.cmake runs it under mpirun and checks the whole job ends promptly, each rank
// saying what happened to it.
#include <csignal>
#include <string>
#include <vector>

#include "distributed/communicator.hpp"
#include "ir/error.hpp"

int main(int argc, char** argv) {
  const std::string how = argc > 1 ? argv[1] : "throw";
  qkv::distributed::Communicator& c = qkv::distributed::Communicator::world();
  try {
    for (int i = 0; i < 1000; ++i) {
      if (i == 3 && c.rank() == c.size() - 1) {
        if (how == "kill") std::raise(SIGKILL);
        throw qkv::ShapeError("injected failure on the last rank");
      }
      std::vector<float> x(16, 1.0f);
      c.allreduce_sum(x);
    }
  } catch (const qkv::Error& e) {
    c.abort(qkv::exit_code(e), e.what());
  }
  return 0;  // only if no rank failed: the check fails the test
}
