// python_child.hpp: a Python interpreter run as a child process that talks one JSON
// line at a time over its stdin and stdout (its stderr stays the terminal's). Used by verl's
// custom_reward_function pool and the Python-side loggers (driver/) and by the rollout's tool
// host (workers/rollout/tool_host.hpp).
//
// Thread-safety: none; one owner per child.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "proto/status.hpp"

namespace tessera::runtime {

using Clock = std::chrono::steady_clock;

/// One running child: its pid and the parent's ends of its stdin and stdout pipes.
struct PythonChild {
  pid_t pid = -1;
  int in = -1;   ///< The child's stdin.
  int out = -1;  ///< The child's stdout.
  std::string buffer;  ///< Bytes read from `out` past the last line returned.
};

/// The first lines of every child script: the protocol keeps private copies of the pipes
/// (`proto` to write answers to, `requests` to read from; os.dup's copies are not inherited), fd 1
/// becomes stderr and fd 0 /dev/null, so nothing the script runs or starts (a user's print, a
/// library's subprocess) can write into the answers or read the requests. Imports json, os, sys.
inline constexpr const char* kProtocolPipes = R"PY(
import json, os, sys
proto, requests = os.fdopen(os.dup(1), "w", encoding="utf-8"), os.fdopen(os.dup(0), encoding="utf-8")
os.dup2(2, 1)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
sys.stdout = sys.stderr
)PY";

/// Also before every child script: helpers for answers in JSON. plain(o): numpy / torch values
/// as lists and numbers (the child's own values, not a worker's tensors); finite(o): NaN and
/// infinities as null; encodable(o): both, raising where JSON cannot carry the value (a key that
/// is not a string); send(message): one line to the parent.
inline constexpr const char* kJsonAnswers = R"PY(
import math

def plain(o):  # the child's numpy / torch values (host-side by construction): JSON has no tensors
    if hasattr(o, "tolist"):
        return o.tolist()
    return o.item() if hasattr(o, "item") else str(o)

def finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o

def encodable(o):
    return finite(json.loads(json.dumps(o, default=plain)))

def send(message):
    proto.write(json.dumps(message, allow_nan=False) + "\n")
    proto.flush()
)PY";

/// Starts `python -u -c <kProtocolPipes><kJsonAnswers><script> args...` with the parent's environment; the parent's end of its
/// stdin does not block (write_all waits with a deadline). Ignores SIGPIPE in this process (a
/// dead child is then an error on write, not the end of Tessera). Errors name `what`.
Result<PythonChild> spawn_python(const std::string& python, const std::string& script,
                                 const std::vector<std::string>& args, const std::string& what);

/// Closes both pipes, then kills the child (SIGKILL) and reaps it. Leaves `child` empty.
void kill_child(PythonChild& child);

/// Closes the child's stdin (its end-of-input), waits up to `grace` for it to exit, then kills
/// it. Returns its exit status, or nullopt when it had to be killed (or had no exit status).
std::optional<int> finish_child(PythonChild& child, std::chrono::milliseconds grace);

/// The next line of `child`'s stdout (without the newline), waiting until `deadline`: timeout,
/// or unavailable when the child closed its stdout (exited).
Result<std::string> read_line(PythonChild& child, Clock::time_point deadline);

/// Writes all of `data` to the child's stdin: unavailable when it exited, timeout when it has not
/// taken the data by `deadline`.
Status write_all(PythonChild& child, const std::string& data, Clock::time_point deadline = Clock::time_point::max());

/// `s` up to its first newline.
std::string first_line(std::string s);

/// The interpreter named by the environment variable `env_var` when it is set and not empty,
/// else python3 (each Python child has its own variable: TESSERA_REWARD_PYTHON, ...).
std::string python_from_env(const char* env_var);

}  // namespace tessera::runtime
