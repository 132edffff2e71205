// test_workers.hpp: worker types used by the runtime tests and benchmarks.
//
//   "echo"  double_it(DataProto) -> every tensor * 2, meta_info["rank"] = rank
//           identity(DataProto)  -> the same DataProto (bandwidth benchmark)
//           sum(DataProto)       -> JSON {"sum": sum of every tensor, "rows": n}
//           rank_info()          -> JSON of the WorkerContext
//           fail()               -> throws std::runtime_error("boom")
//           torch_fail()         -> a LibTorch shape error (c10::Error)
//           add(a, b)            -> JSON a + b
//           log(x)               -> JSON array of every x logged so far, in arrival order
//           wait_fifo(path, rows) -> blocks until a byte B is written into FIFO `path`, then
//                                   DataProto {"x": rows x 32768 floats = B} (a hung worker,
//                                   or a call that only the worker's death ends)
//   "critic" value(DataProto)    -> JSON {"role": "critic", "rows": n}
//   Init config {"fail": true} makes construction fail; {"throw": true} makes it throw.
#pragma once

#include <string>

#include "runtime/worker.hpp"

namespace tessera::runtime::testing {

/// Registers "echo" and "critic" into `registry`.
void register_test_workers(WorkerTypeRegistry& registry);

/// A registry holding the test workers.
const WorkerTypeRegistry& test_registry();

/// A raw connection to the abstract Unix socket `name` (no leading NUL; Note [Local call
/// socket] in runtime/internal/call_channel.hpp), for tests that misbehave on it; -1 on failure.
int connect_local_socket(const std::string& name);

}  // namespace tessera::runtime::testing
