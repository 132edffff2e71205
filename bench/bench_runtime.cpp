// bench_runtime: the distributed runtime's round trips and bandwidth, as ratios within one run.
//
//   BM_rt_dp_proto_rtt_inproc      DP_COMPUTE_PROTO call, 8 in-process workers (goal <= 20 us)
//   BM_rt_dp_proto_rtt_inproc_2workers  the same call to a group of 2 in-process workers: one
//                                  per vCPU on the 2-vCPU development machine
//   BM_rt_dp_proto_rtt_inproc_cut/receivers:R  the 8-worker call with the chunks cut by the
//                                  ranks (R=1) or by the caller (R=0) whatever the default
//                                  (Note [Chunks cut by the receiver]; WorkerGroupOptions::
//                                  cut_rows_on_receivers)
//   BM_rt_dp_proto_rtt_inproc_loaded/poll:P  the 8-worker call while two nice-10 threads burn
//                                  CPU: P=1 the default runtime, P=0 one with polling off
//                                  (Note [Polling under contention])
//   BM_rt_dp_proto_rtt_2agents     the same over 2 agent processes x 4 workers (goal <= 200 us),
//                                  through the agents' call channels, over their local
//                                  sockets (Note [Call channel], Note [Local call socket])
//   BM_rt_dp_proto_rtt_2agents_tcp the same with the channels over loopback TCP (shared memory
//                                  off, as for agents on other machines; 2 more agents)
//   BM_rt_dp_proto_rtt_2agents_caf the same with cluster.call_channel off: calls through CAF
//                                  (2 more agents, started for it)
//   BM_rt_caf_request_rtt          bare CAF request/response to an agent (same two processes)
//   BM_rt_asio_rtt                 8-byte raw Asio TCP ping-pong to a child process
//   BM_rt_handoff_floor/poll       the machine's floor for an 8-thread fan-out: a counter handed
//                                  to 8 threads that poll (yielding, like the workers' lanes) and
//                                  8 acknowledgements awaited; no work, no allocation
//   BM_rt_handoff_floor/sleep      the same with threads sleeping on condition variables (what
//                                  every hand-off costs without Note [Local lanes])
//   BM_rt_handoff_model/caller_us:C/worker_us:W  the polling hand-off with C us of busy work
//                                  by the caller (half before, half after: split and collect)
//                                  and W us by each thread: a model of the in-process call
//                                  (measured inside one: caller ~13 us, each worker ~1 us) that
//                                  shows what this machine makes of that much work
//   BM_rt_dataproto_roundtrip/256  256 MiB DataProto driver -> agent -> driver (same host),
//                                  after 2 untimed warm-up round trips; bytes_per_second
//                                  counts both directions
//   BM_rt_memcpy/256               memcpy of 256 MiB into a warm buffer (the goal's baseline)
//   BM_rt_soak_100k                100 000 calls over the agents: rss_growth_pct, lost_replies
//
// The binary re-executes itself as the agents (--tessera-agent) and as the echo server
// (--tessera-echo); agents print their ready line on a pipe that is read with poll().
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <thread>

#include <boost/asio.hpp>
#include <caf/scoped_actor.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "dispatch/worker_group.hpp"
#include "runtime/agent_main.hpp"
#include "runtime/errors.hpp"
#include "runtime/local_lane.hpp"
#include "runtime/runtime.hpp"

extern char** environ;

namespace tessera {
namespace {

namespace asio = boost::asio;
using dispatch::Value;
const char* kToken = "bench-runtime-token-0123456789abcdef";

// ---- worker type and processes -----------------------------------------------------------------

class BenchWorker : public dispatch::WorkerBase {
 public:
  explicit BenchWorker(const runtime::WorkerContext& ctx) : WorkerBase(ctx) {
    (void)methods().add("identity", dispatch::Dispatch::DP_COMPUTE_PROTO,
                        [](const dispatch::Args& a) -> Result<Value> { return a.at(0); });
    (void)methods().add("whole", dispatch::Dispatch::ALL_TO_ALL,
                        [](const dispatch::Args& a) -> Result<Value> { return a.at(0); });
  }
};

const runtime::WorkerTypeRegistry& registry() {
  static const runtime::WorkerTypeRegistry r = [] {
    runtime::WorkerTypeRegistry reg;
    (void)dispatch::register_worker_type(reg, "bench", [](const runtime::WorkerContext& c,
                                                          const nlohmann::json&)
                                             -> Result<std::unique_ptr<dispatch::WorkerBase>> {
      return std::unique_ptr<dispatch::WorkerBase>(std::make_unique<BenchWorker>(c));
    });
    return reg;
  }();
  return r;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_runtime: %s\n", what.c_str());
  std::exit(1);
}

// A child process (agent or echo server). Its stdout (where agents also log) is drained to
// stderr after the ready line, so a chatty child can never block on a full pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;
  std::string line;
  std::thread drain;

  void stop(int sig) {
    if (pid > 0) {
      if (sig != 0) ::kill(pid, sig);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (drain.joinable()) drain.join();
    if (out >= 0) ::close(out);
    out = -1;
  }
};

std::unique_ptr<Child> spawn_self(std::vector<std::string> args) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) die("pipe2 failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], STDOUT_FILENO);
  args.insert(args.begin(), "/proc/self/exe");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto c = std::make_unique<Child>();
  if (posix_spawn(&c->pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ) != 0) {
    die("posix_spawn of " + args[1] + " failed");
  }
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  c->out = p[0];
  char ch;
  pollfd pf{c->out, POLLIN, 0};
  while (::poll(&pf, 1, 30000) > 0 && ::read(c->out, &ch, 1) == 1 && ch != '\n') c->line += ch;
  int fd = c->out;
  c->drain = std::thread([fd] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) (void)!::write(STDERR_FILENO, buf, n);
  });
  return c;
}

std::string token_file() {
  static const std::string path = [] {
    std::string p = "/tmp/tessera-bench-token-" + std::to_string(::getpid());
    std::ofstream(p) << kToken << "\n";
    ::chmod(p.c_str(), 0600);
    return p;
  }();
  return path;
}

// ---- shared fixtures (built on first use, torn down at exit) ----------------------------------

struct Cluster {
  std::vector<std::unique_ptr<Child>> agents;
  std::unique_ptr<runtime::Runtime> rt;
  std::shared_ptr<dispatch::WorkerGroup> wg;  // 8 ranks over both agents
  ~Cluster() {
    wg.reset();
    rt.reset();
    for (auto& a : agents) a->stop(SIGTERM);
  }
};

template <class T>
T checked(Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.status().to_string());
  return std::move(r).value();
}

// How the driver calls the agents' workers.
enum class Path { caf = 0, channel_tcp = 1, channel_local = 2 };
std::unique_ptr<Cluster> g_clusters[3];  // by Path

// TESSERA_BENCH_IDLE_POLL_US overrides RuntimeConfig::idle_poll (driver and agents), to compare.
std::chrono::microseconds bench_idle_poll(std::chrono::microseconds fallback) {
  const char* v = std::getenv("TESSERA_BENCH_IDLE_POLL_US");
  return v == nullptr ? fallback : std::chrono::microseconds(std::atoll(v));
}

// Two agents x 4 workers, called along `path` (the default config: channel_local).
Cluster& cluster(Path path = Path::channel_local) {
  std::unique_ptr<Cluster>& g = g_clusters[static_cast<int>(path)];
  if (!g) {
    g = std::make_unique<Cluster>();
    Cluster& k = *g;
    runtime::RuntimeConfig cfg;
    cfg.idle_poll = bench_idle_poll(cfg.idle_poll);
    cfg.call_channel = path != Path::caf;
    cfg.data_plane.shared_memory = path != Path::channel_tcp;
    for (int i = 0; i < 2; ++i) {
      k.agents.push_back(spawn_self({"--tessera-agent", "--devices", "cpu:4", "--token-file",
                                     token_file()}));
      std::smatch m;
      if (!std::regex_search(k.agents.back()->line, m, std::regex(R"(listen=(\S+))"))) {
        die("agent did not start: '" + k.agents.back()->line + "'");
      }
      cfg.agents.push_back(m[1]);
    }
    cfg.token = kToken;
    k.rt = checked(runtime::Runtime::start(cfg, registry()), "driver runtime");
    k.wg = checked(dispatch::WorkerGroup::spawn(*k.rt, "bench",
                                                checked(k.rt->resource_pool(), "resource pool"),
                                                {{"", "bench", "{}"}}),
                   "spawning 8 workers on 2 agents");
  }
  return *g;
}

struct Embedded {
  std::unique_ptr<runtime::Runtime> rt;
  std::shared_ptr<dispatch::WorkerGroup> wg;   // 8 workers, cpu:0-7
  std::shared_ptr<dispatch::WorkerGroup> wg2;  // 2 more workers, one per vCPU here
  std::shared_ptr<dispatch::WorkerGroup> cut[2];  // 8 workers each: the caller / the ranks cut
};

// The group whose chunks `receivers` (1) or the caller (0) cut, spawned on first use only.
dispatch::WorkerGroup& cut_group(Embedded& e, int receivers) {
  if (!e.cut[receivers]) {
    dispatch::WorkerGroupOptions options;
    options.cut_rows_on_receivers = receivers == 1;
    e.cut[receivers] = checked(
        dispatch::WorkerGroup::spawn(*e.rt, receivers ? "bench_cut1" : "bench_cut0",
                                     checked(e.rt->resource_pool(), "resource pool"),
                                     {{"", "bench", "{}"}}, options),
        "spawning 8 in-process workers");
  }
  return *e.cut[receivers];
}

std::unique_ptr<Embedded> g_embedded;

Embedded& embedded() {
  if (!g_embedded) {
    runtime::RuntimeConfig cfg;
    cfg.embedded_devices = "cpu:8";
    cfg.idle_poll = bench_idle_poll(cfg.idle_poll);
    g_embedded = std::make_unique<Embedded>();
    g_embedded->rt = checked(runtime::Runtime::start(cfg, registry()), "embedded runtime");
    g_embedded->wg = checked(
        dispatch::WorkerGroup::spawn(*g_embedded->rt, "bench",
                                     checked(g_embedded->rt->resource_pool(), "resource pool"),
                                     {{"", "bench", "{}"}}),
        "spawning 8 in-process workers");
    g_embedded->wg2 = checked(
        dispatch::WorkerGroup::spawn(*g_embedded->rt, "bench2",
                                     checked(g_embedded->rt->resource_pool({2}), "resource pool"),
                                     {{"", "bench", "{}"}}),
        "spawning 2 in-process workers");
  }
  return *g_embedded;
}

proto::DataProto small_batch() {
  return *proto::DataProto::from_dict({{"x", torch::arange(32, torch::kFloat32).view({8, 4})}});
}

// Steady state: 500 untimed calls first (the agents' and workers' first calls fault in code and
// pages that a training run pays once).
void dp_rtt(benchmark::State& state, dispatch::WorkerGroup& wg) {
  Value in(small_batch());
  for (int i = 0; i < 500; ++i) (void)wg.call("identity", {in});
  uint64_t stalls = runtime::internal::poll_stalls();
  uint64_t lone = runtime::internal::poll_lone_stalls();
  for (auto _ : state) {
    auto out = wg.call("identity", {in});
    if (!out.ok()) state.SkipWithError(out.status().to_string().c_str());
  }
  // Note [Polling under contention]: backoff windows this process opened while timed, and the
  // lone stalls that opened none.
  state.counters["poll_stalls"] = static_cast<double>(runtime::internal::poll_stalls() - stalls);
  state.counters["lone_stalls"] =
      static_cast<double>(runtime::internal::poll_lone_stalls() - lone);
}

void BM_rt_dp_proto_rtt_inproc(benchmark::State& state) { dp_rtt(state, *embedded().wg); }

void BM_rt_dp_proto_rtt_inproc_2workers(benchmark::State& state) { dp_rtt(state, *embedded().wg2); }

void BM_rt_dp_proto_rtt_inproc_cut(benchmark::State& state) {
  dp_rtt(state, cut_group(embedded(), state.range(0) == 1 ? 1 : 0));
}

// An embedded runtime whose workers and callers never poll (cluster.idle_poll_us = 0).
std::unique_ptr<Embedded> g_embedded_sleeping;
Embedded& embedded_sleeping() {
  if (!g_embedded_sleeping) {
    runtime::RuntimeConfig cfg;
    cfg.embedded_devices = "cpu:8";
    cfg.idle_poll = std::chrono::microseconds(0);
    auto e = std::make_unique<Embedded>();
    e->rt = checked(runtime::Runtime::start(cfg, registry()), "embedded runtime (no polling)");
    e->wg = checked(dispatch::WorkerGroup::spawn(*e->rt, "bench_sleeping",
                                                 checked(e->rt->resource_pool(), "resource pool"),
                                                 {{"", "bench", "{}"}}),
                    "spawning 8 in-process workers");
    g_embedded_sleeping = std::move(e);
  }
  return *g_embedded_sleeping;
}

// Two threads of CPU-bound work at nice 10 (a niced build or data loader sharing the machine)
// for as long as it lives.
class CpuLoad {
 public:
  CpuLoad() {
    for (int i = 0; i < 2; ++i) {
      threads_.emplace_back([this] {
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
        volatile uint64_t x = 0;
        while (!stop_.load(std::memory_order_relaxed)) x = x + 1;
      });
    }
  }
  ~CpuLoad() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Note [Polling under contention] in runtime/local_lane.hpp: the in-process round trip while
// CPU-bound work shares the machine, with the default (polling) runtime and with polling off.
void BM_rt_dp_proto_rtt_inproc_loaded(benchmark::State& state) {
  dispatch::WorkerGroup& wg = state.range(0) != 0 ? *embedded().wg : *embedded_sleeping().wg;
  {
    CpuLoad load;
    dp_rtt(state, wg);
  }
  // The burners' backoff window is process-wide and can last up to 1.28 s: it would otherwise
  // switch polling off under whichever benchmark runs next (bench/run shuffles them).
  runtime::internal::end_poll_window();
}

void BM_rt_dp_proto_rtt_2agents(benchmark::State& state) { dp_rtt(state, *cluster().wg); }

void BM_rt_dp_proto_rtt_2agents_tcp(benchmark::State& state) {
  dp_rtt(state, *cluster(Path::channel_tcp).wg);
}

void BM_rt_dp_proto_rtt_2agents_caf(benchmark::State& state) {
  dp_rtt(state, *cluster(Path::caf).wg);
}

void BM_rt_caf_request_rtt(benchmark::State& state) {
  Cluster& c = cluster();
  caf::scoped_actor self{c.rt->system()};
  const caf::actor& agent = c.rt->nodes()[0].agent;
  for (auto _ : state) {
    bool ok = false;
    self->request(agent, std::chrono::seconds(10), runtime::info_atom::value)
        .receive([&](runtime::AgentInfo&) { ok = true; }, [&](caf::error&) {});
    if (!ok) state.SkipWithError("agent did not answer");
  }
}

// Busy for `us` microseconds (the model's stand-in for work; 0: nothing).
void spin_for(double us) {
  if (us <= 0) return;
  auto until = std::chrono::steady_clock::now() +
               std::chrono::nanoseconds(static_cast<int64_t>(us * 1e3));
  while (std::chrono::steady_clock::now() < until) {
  }
}

// 8 threads, each handed a counter per iteration and acknowledging it. `caller_us` of busy work
// is done by the caller, half before the hand-off and half after the last acknowledgement (a
// call's split and collect); `worker_us` by each thread before it acknowledges.
void run_handoff(benchmark::State& state, bool poll, double caller_us, double worker_us) {
  constexpr int kThreads = 8;
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    std::atomic<uint64_t> seq{0};
  };
  std::vector<Slot> slots(kThreads);
  std::atomic<int> acks{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      Slot& s = slots[i];
      uint64_t seen = 0;
      while (!stop.load(std::memory_order_acquire)) {
        if (poll) {
          if (s.seq.load(std::memory_order_acquire) == seen) {
            std::this_thread::yield();
            continue;
          }
        } else {
          std::unique_lock<std::mutex> lock(s.mu);
          s.cv.wait(lock, [&] { return s.seq.load() != seen || stop.load(); });
          if (stop.load()) break;
        }
        seen = s.seq.load(std::memory_order_acquire);
        spin_for(worker_us);
        acks.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  for (auto _ : state) {
    spin_for(caller_us / 2);
    acks.store(0, std::memory_order_release);
    for (Slot& s : slots) {
      if (poll) {
        s.seq.fetch_add(1, std::memory_order_acq_rel);
      } else {
        { std::lock_guard<std::mutex> lock(s.mu); s.seq.fetch_add(1); }
        s.cv.notify_one();
      }
    }
    while (acks.load(std::memory_order_acquire) < kThreads) {
      if (poll) std::this_thread::yield();
    }
    spin_for(caller_us / 2);
  }
  stop.store(true, std::memory_order_release);
  for (Slot& s : slots) {
    { std::lock_guard<std::mutex> lock(s.mu); }
    s.cv.notify_one();
  }
  for (auto& t : threads) t.join();
}

// Note [Local lanes]'s floor: `poll` 1 = workers poll, 0 = they sleep on condition variables.
void BM_rt_handoff_floor(benchmark::State& state) { run_handoff(state, state.range(0) != 0, 0, 0); }

void BM_rt_handoff_model(benchmark::State& state) {
  run_handoff(state, true, static_cast<double>(state.range(0)),
              static_cast<double>(state.range(1)));
}

int echo_main() {
  asio::io_context io;
  asio::ip::tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), 0});
  std::printf("echo port=%u\n", acc.local_endpoint().port());
  std::fflush(stdout);
  asio::ip::tcp::socket s(io);
  acc.accept(s);
  s.set_option(asio::ip::tcp::no_delay(true));
  char buf[8];
  boost::system::error_code ec;
  while (!ec) {
    asio::read(s, asio::buffer(buf), ec);
    if (!ec) asio::write(s, asio::buffer(buf), ec);
  }
  return 0;
}

void BM_rt_asio_rtt(benchmark::State& state) {
  std::unique_ptr<Child> echo = spawn_self({"--tessera-echo"});
  std::smatch m;
  if (!std::regex_search(echo->line, m, std::regex(R"(port=(\d+))"))) {
    die("echo server did not start: '" + echo->line + "'");
  }
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(std::stoi(m[1]))}, ec);
  if (ec) die("connecting to the echo server: " + ec.message());
  s.set_option(asio::ip::tcp::no_delay(true));
  char buf[8] = {};
  for (auto _ : state) {
    asio::write(s, asio::buffer(buf));
    asio::read(s, asio::buffer(buf));
  }
  s.close();
  echo->stop(0);  // it exits when the connection closes
}

void BM_rt_dataproto_roundtrip(benchmark::State& state) {
  Cluster& c = cluster();
  int64_t mib = state.range(0);
  int64_t rows = 1024;
  auto x = torch::rand({rows, mib * 1024 * 1024 / 4 / rows}, torch::kFloat32);
  proto::DataProto in = *proto::DataProto::from_dict({{"x", x}});
  std::vector<runtime::WorkerRef> one = {c.wg->workers()[0]};
  // Untimed warm-up: the first transfers create and fault in the landing segments on both
  // sides (Note [Landing segments]); steady state reuses them.
  for (int i = 0; i < 2; ++i) {
    auto out = c.rt->call(one, "whole", {{runtime::Value(in)}});
    if (!out.ok()) state.SkipWithError(out.status().to_string().c_str());
  }
  for (auto _ : state) {
    auto out = c.rt->call(one, "whole", {{runtime::Value(in)}});
    if (!out.ok()) state.SkipWithError(out.status().to_string().c_str());
  }
  state.SetBytesProcessed(state.iterations() * 2 * mib * 1024 * 1024);
}

void BM_rt_memcpy(benchmark::State& state) {
  size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}

double rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

void BM_rt_soak_100k(benchmark::State& state) {
  Cluster& c = cluster();
  Value in(small_batch());
  auto expect = small_batch().tensor("x").value();
  for (auto _ : state) {
    for (int i = 0; i < 1000; ++i) (void)c.wg->call("identity", {in});  // warm-up
    double rss0 = rss_mib(::getpid()), a0 = rss_mib(c.agents[0]->pid), b0 = rss_mib(c.agents[1]->pid);
    int64_t lost = 0;
    for (int i = 0; i < 100000; ++i) {
      auto out = c.wg->call("identity", {in});
      if (!out.ok() || !torch::equal(*out->proto().tensor("x"), expect)) ++lost;
    }
    state.counters["lost_replies"] = static_cast<double>(lost);
    state.counters["rss_growth_pct"] = 100.0 * (rss_mib(::getpid()) - rss0) / rss0;
    state.counters["agent_rss_growth_pct"] =
        100.0 * std::max(rss_mib(c.agents[0]->pid) - a0, rss_mib(c.agents[1]->pid) - b0) /
        std::min(a0, b0);
    state.counters["driver_payloads_left"] = static_cast<double>(c.rt->data_plane().stats().payloads);
  }
}

BENCHMARK(BM_rt_dp_proto_rtt_inproc)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_dp_proto_rtt_inproc_2workers)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_dp_proto_rtt_inproc_cut)
    ->ArgName("receivers")
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_dp_proto_rtt_inproc_loaded)
    ->ArgName("poll")
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_dp_proto_rtt_2agents)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_dp_proto_rtt_2agents_tcp)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_dp_proto_rtt_2agents_caf)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_caf_request_rtt)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_asio_rtt)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_handoff_floor)->ArgName("poll")->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rt_handoff_model)
    ->ArgNames({"caller_us", "worker_us"})
    ->Args({13, 1})
    ->Args({5, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
// Once each even when bench/run repeats the others (--benchmark_repetitions): long and steady.
BENCHMARK(BM_rt_dataproto_roundtrip)
    ->Arg(256)
    ->Iterations(5)
    ->Repetitions(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_rt_memcpy)->Arg(256)->Repetitions(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_rt_soak_100k)->Iterations(1)->Repetitions(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--tessera-echo") == 0) return tessera::echo_main();
  if (argc >= 2 && std::strcmp(argv[1], "--tessera-agent") == 0) {
    tessera::runtime::AgentOptions o;
    o.listen = "127.0.0.1:0";
    o.runtime.idle_poll = tessera::bench_idle_poll(o.runtime.idle_poll);
    for (int i = 2; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--devices") == 0) o.devices = argv[i + 1];
      if (std::strcmp(argv[i], "--token-file") == 0) o.token_file = argv[i + 1];
    }
    return tessera::runtime::run_agent(o, tessera::registry());
  }
  // stdout carries the benchmark report (JSON under bench/run): the runtime logs to stderr.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("bench_runtime"));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  tessera::g_embedded.reset();
  tessera::g_embedded_sleeping.reset();
  for (auto& c : tessera::g_clusters) c.reset();
  ::unlink(tessera::token_file().c_str());
  return 0;
}
