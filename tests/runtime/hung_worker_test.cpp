// Note [Late replies], in process: a worker that is alive but hung (blocked on a FIFO the test
// controls) times out; the caller keeps nothing, and the late answer is dropped with its payload.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

// A fresh FIFO under the test temp dir.
std::string make_fifo(const std::string& name) {
  std::string path = ::testing::TempDir() + "/" + name;
  ::unlink(path.c_str());
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

// Opens the latch: blocks until the worker has the FIFO open, then writes one byte.
void open_latch(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  char byte = 5;
  EXPECT_EQ(::write(fd, &byte, 1), 1);
  ::close(fd);
}

TEST(HungWorker, ATimedOutLocalCallKeepsNothingAndItsLateAnswerIsDropped) {
  RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:1";
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("hung", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  std::string fifo = make_fifo("hung_local_fifo");
  CallCounters before = call_counters();

  CallRequest req;
  req.method = "wait_fifo";
  req.args = {json_wire(fifo), json_wire(2)};
  CallOptions opts;
  opts.timeout = Millis(200);
  auto batch = (*rt)->call_wire(*workers, {req}, opts);
  Status st = batch->wait()[0].status();
  EXPECT_EQ(st.code(), ErrorCode::timeout);
  for (const char* part : {"rank 0", "'wait_fifo'", "group 'hung'"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.message();
  }
  batch.reset();
  // The worker still holds the call (it is blocked in it), but not the caller's batch. (Not
  // checked after a completed call: the answering thread may still hold it for a moment.)
  EXPECT_EQ(call_counters().live_batches, before.live_batches);

  open_latch(fifo);
  // The next call queues behind the late one on the same worker: once it is answered, the
  // late answer has been handled.
  auto info = (*rt)->call(*workers, "rank_info", std::vector<std::vector<Value>>(1));
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ((*info)[0].json()["rank"], 0);
  CallCounters after = call_counters();
  EXPECT_EQ(after.late_replies_dropped, before.late_replies_dropped + 1);
  // An in-process caller gets results by reference (Note [In-process values]): the late
  // DataProto was never published, so it is freed with the dropped answer, and nothing is
  // left on the data plane.
  EXPECT_EQ(after.late_payloads_released, before.late_payloads_released);
  EXPECT_EQ((*rt)->data_plane().stats().payloads, 0u);
  ::unlink(fifo.c_str());
}

}  // namespace
}  // namespace tessera::runtime
