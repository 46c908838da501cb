// The job's communicator: run alone (a job of one) and under mpirun -np 2 and -np 4 by ctest.
// Every rank runs every test; collectives are called unconditionally (EXPECT, never ASSERT,
// around them) so a failure on one rank cannot leave the others waiting.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>

#include "distributed/communicator.hpp"

namespace qkv {
namespace {

using distributed::Communicator;

TEST(Communicator, IsTheJobTheLauncherStarted) {
  Communicator& c = Communicator::world();
  // ctest says how many ranks it launched: a build that ran each rank as a job of one (MPI not
  // built in, or not started) would pass the other tests trivially.
  const char* expect = std::getenv("QKV_EXPECT_RANKS");
  EXPECT_EQ(c.size(), expect ? std::atoi(expect) : 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  EXPECT_EQ(c.describe(), "rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()));
}

TEST(Communicator, AllreduceSumsOverTheRanks) {
  Communicator& c = Communicator::world();
  std::vector<float> f = {1.0f, static_cast<float>(c.rank()), -2.5f};
  c.allreduce_sum(f);
  const double p = c.size();
  EXPECT_EQ(f[0], p);
  EXPECT_EQ(f[1], p * (p - 1) / 2);
  EXPECT_EQ(f[2], -2.5 * p);
  std::vector<double> d(1000, 0.25 * (c.rank() + 1));
  c.allreduce_sum(d);
  for (double x : d) EXPECT_EQ(x, 0.25 * p * (p + 1) / 2);
}

TEST(Communicator, StartedAllreducesCompleteOnWait) {
  Communicator& c = Communicator::world();
  std::vector<float> a(4097, 1.0f), b(3, static_cast<float>(c.rank()));
  distributed::Pending pa = c.start_allreduce_sum(a);
  distributed::Pending pb = c.start_allreduce_sum(b);
  pb.wait();
  pa.wait();
  pa.wait();  // a second wait does nothing
  for (float x : a) EXPECT_EQ(x, c.size());
  EXPECT_EQ(b[2], c.size() * (c.size() - 1) / 2);
}

TEST(Communicator, BroadcastsFromAnyRoot) {
  Communicator& c = Communicator::world();
  const int root = c.size() - 1;
  std::string s = c.rank() == root ? "from the last rank" : "..................";
  c.broadcast(std::as_writable_bytes(std::span<char>(s.data(), s.size())), root);
  EXPECT_EQ(s, "from the last rank");
  EXPECT_THROW(c.broadcast({}, c.size()), DistError);
}

TEST(Communicator, AllgathersStringsOfAnyLength) {
  Communicator& c = Communicator::world();
  const std::vector<std::string> all = c.allgather(std::string(static_cast<std::size_t>(c.rank()), 'x'));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], std::string(static_cast<std::size_t>(r), 'x'));
}

TEST(Communicator, SendrecvPassesBlocksAroundTheRing) {
  Communicator& c = Communicator::world();
  const int p = c.size(), next = (c.rank() + 1) % p, prev = (c.rank() + p - 1) % p;
  std::vector<float> block(100, static_cast<float>(c.rank())), incoming(100);
  // After P steps every block is back home, having visited every rank.
  float seen = 0;
  for (int step = 0; step < p; ++step) {
    c.sendrecv(block, next, incoming, prev);
    std::swap(block, incoming);
    seen += block[0];
  }
  EXPECT_EQ(block[99], c.rank());
  EXPECT_EQ(seen, p * (p - 1) / 2);
  std::vector<float> shorter(99);
  EXPECT_THROW(c.sendrecv(block, next, shorter, prev), DistError);
  EXPECT_THROW(c.sendrecv(block, p, incoming, prev), DistError);
}

}  // namespace
}  // namespace qkv
