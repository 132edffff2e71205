// Offload round trips (bitwise), sharded checkpoints loaded at another world size continuing
// exactly like an uninterrupted run, interrupted saves (an error before publication, and a child
// process killed mid-save) leaving the previous checkpoint loadable, and HF export.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "proto/host_transfer.hpp"
#include "workers/fsdp/checkpoint.hpp"
#include "workers/fsdp/internal/activation_stash.hpp"
#include "workers/fsdp/internal/streamed_moments.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::fsdp {
namespace {

using namespace testing;
using collective::Communicator;
using S = ShardingStrategy;
namespace fs = std::filesystem;

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

std::string temp_dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "tessera_fsdp_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::remove_all(dir + ".tmp");
  return dir;
}

bool all_equal(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    if (!b.count(k) || !at::equal(v, b.at(k))) return false;
  }
  return true;
}

TEST(Offload, RoundTripIsBitwiseAndTrainingContinuesExactly) {
  RunResult want = reference_run(3);
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, true);
    fsdp_step(*e, w, 0, true);
    std::vector<at::Tensor> shards, m, v;
    for (size_t u = 0; u < e->layouts().size(); ++u) {
      auto& s = e->unit_state(static_cast<int>(u));
      shards.push_back(s.shard.clone());
      m.push_back(s.adam.exp_avg.clone());
      v.push_back(s.adam.exp_avg_sq.clone());
    }
    int64_t resident = e->resident_bytes();
    EXPECT_GT(resident, 0);
    ASSERT_TRUE(e->offload_params().ok());
    ASSERT_TRUE(e->offload_optimizer().ok());
    EXPECT_EQ(e->resident_bytes(), 0);  // the working copies are freed
    EXPECT_FALSE(e->unit_state(0).shard.defined());
    Status st = e->begin_forward(ForwardMode::train);
    EXPECT_NE(st.message().find("call load_params() first"), std::string::npos) << st.message();
    ASSERT_TRUE(e->load_params().ok());
    ASSERT_TRUE(e->load_optimizer().ok());
    EXPECT_EQ(e->resident_bytes(), resident);
    for (size_t u = 0; u < shards.size(); ++u) {
      auto& s = e->unit_state(static_cast<int>(u));
      EXPECT_TRUE(at::equal(s.shard, shards[u]));
      EXPECT_TRUE(at::equal(s.adam.exp_avg, m[u]));
      EXPECT_TRUE(at::equal(s.adam.exp_avg_sq, v[u]));
    }
    for (int s = 1; s < 3; ++s) fsdp_step(*e, w, s, true);
    EXPECT_LE(max_relative_error(*e->full_state_dict(at::kFloat), want.params), 1e-5);
  });
}

// Note [Streamed optimizer step]: with optimizer_offload the moments are created on the host, step()
// streams them through the device unit by unit and leaves them there, and every number equals the
// resident optimizer's, bit for bit; a checkpoint restores them into the host buffers.
TEST(Offload, StreamedOptimizerStepEqualsTheResidentStepBitwise) {
  const std::string dir = temp_dir("streamed");
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto resident = make_engine(borrow(w), S::full_shard, true);
    auto streamed = make_engine(borrow(w), S::full_shard, true, -1, at::kFloat, test_optim(), /*optimizer_offload=*/true);
    auto expect_same_state = [&](FsdpModule& got, const std::string& when) {
      EXPECT_TRUE(got.optimizer_offloaded()) << when;
      for (size_t u = 0; u < got.layouts().size(); ++u) {
        const auto& g = got.unit_state(static_cast<int>(u));
        const auto& r = resident->unit_state(static_cast<int>(u));
        EXPECT_FALSE(g.adam.exp_avg.defined() || g.adam.exp_avg_sq.defined()) << when << ": moments on the device";
        EXPECT_TRUE(at::equal(g.shard, r.shard)) << when << " unit " << u;
        EXPECT_TRUE(at::equal(g.offload_adam.exp_avg, r.adam.exp_avg)) << when << " unit " << u;
        EXPECT_TRUE(at::equal(g.offload_adam.exp_avg_sq, r.adam.exp_avg_sq)) << when << " unit " << u;
      }
    };
    expect_same_state(*streamed, "after wrap");
    for (int s = 0; s < 3; ++s) {
      StepResult a, b;
      fsdp_step(*resident, w, s, true, &a);
      fsdp_step(*streamed, w, s, true, &b);
      EXPECT_EQ(a.grad_norm, b.grad_norm);
      expect_same_state(*streamed, "step " + std::to_string(s));
    }
    ASSERT_TRUE(save_checkpoint(*streamed, dir).ok());
    auto restored = make_engine(borrow(w), S::full_shard, true, -1, at::kFloat, test_optim(), /*optimizer_offload=*/true);
    Status st = load_checkpoint(*restored, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    expect_same_state(*restored, "restored");
  });
  fs::remove_all(dir);
}

// The same on a GPU, where the moments come in on the compute stream and go home on a stream of
// their own, overlapped (Note [Streamed optimizer step]): given the same gradients, every shard and
// moment equals the resident optimizer's, bit for bit, step after step (AdamW is element-wise).
TEST(Offload, OnCudaStreamedOptimizerStepEqualsTheResidentStepBitwise) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const c10::Device cuda("cuda:0");
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto resident = make_engine(borrow(w), S::full_shard, true, -1, at::kFloat, test_optim(), false, cuda);
    auto streamed = make_engine(borrow(w), S::full_shard, true, -1, at::kFloat, test_optim(), true, cuda);
    ASSERT_TRUE(resident && streamed);
    ASSERT_GE(resident->layouts().size(), 3u);  // more units than the two the stream holds at once
    at::Generator gen = at::detail::createCPUGenerator(77);
    for (int s = 0; s < 3; ++s) {
      for (size_t u = 0; u < resident->layouts().size(); ++u) {
        const auto unit = static_cast<int>(u);
        const at::Tensor g = at::randn(resident->unit_state(unit).shard.sizes(), gen).to(cuda);
        resident->unit_state(unit).shard_grad = g.clone();
        streamed->unit_state(unit).shard_grad = g.clone();
      }
      auto a = resident->step();
      auto b = streamed->step();
      ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << " / " << b.status().to_string();
      EXPECT_EQ(a->grad_norm, b->grad_norm);
      for (size_t u = 0; u < resident->layouts().size(); ++u) {
        const auto& r = resident->unit_state(static_cast<int>(u));
        const auto& g = streamed->unit_state(static_cast<int>(u));
        EXPECT_FALSE(g.adam.exp_avg.defined()) << "step " << s << ": moments left on the device";
        EXPECT_TRUE(g.offload_adam.exp_avg.device().is_cpu());
        EXPECT_TRUE(at::equal(g.shard.cpu(), r.shard.cpu())) << "step " << s << " unit " << u;
        EXPECT_TRUE(at::equal(g.offload_adam.exp_avg, r.adam.exp_avg.cpu())) << "step " << s << " unit " << u;
        EXPECT_TRUE(at::equal(g.offload_adam.exp_avg_sq, r.adam.exp_avg_sq.cpu())) << "step " << s << " unit " << u;
      }
    }
  });
}

// The copies of the streamed step under load (Note [Streamed optimizer step]): on a GPU, large
// units (64 MB moments) alternate with small ones, so that a large unit's copy home is still
// running when the next large unit loads into the blocks the allocator hands back from it (the
// small unit between them takes no time); every host buffer must end with its own unit's values.
// On the CPU the same check runs the plain loop.
void expect_streamed_moments_land_in_their_own_buffers(const c10::Device& device, int64_t n) {
  const int units = 8;
  std::vector<AdamWState> home(units);
  std::vector<AdamWState*> pointers;
  std::vector<int64_t> sizes;
  for (int u = 0; u < units; ++u) {
    sizes.push_back(u % 2 == 0 ? n : n / 64);
    home[u].exp_avg = proto::offload_buffer({sizes[u]}, at::kFloat, device).fill_(u);
    home[u].exp_avg_sq = proto::offload_buffer({sizes[u]}, at::kFloat, device).fill_(-u);
    pointers.push_back(&home[u]);
  }
  for (int round = 1; round <= 3; ++round) {
    internal::stream_moments(pointers, device, [&](size_t u, AdamWState& working) {
      EXPECT_EQ(working.exp_avg.device(), device);
      working.exp_avg.add_(1000.0 * static_cast<double>(u + 1));
      working.exp_avg_sq.sub_(1000.0);
    });
    for (int u = 0; u < units; ++u) {
      EXPECT_TRUE(at::equal(home[u].exp_avg, at::full({sizes[u]}, u + 1000.0 * (u + 1) * round)))
          << "round " << round << " unit " << u;
      EXPECT_TRUE(at::equal(home[u].exp_avg_sq, at::full({sizes[u]}, -u - 1000.0 * round)))
          << "round " << round << " unit " << u;
    }
  }
}

TEST(Offload, StreamedMomentsLandInTheirOwnUnitsBuffers) {
  expect_streamed_moments_land_in_their_own_buffers(c10::Device(c10::DeviceType::CPU), int64_t{1} << 16);
}

TEST(Offload, OnCudaStreamedMomentsLandInTheirOwnUnitsBuffers) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  expect_streamed_moments_land_in_their_own_buffers(c10::Device("cuda:0"), int64_t{16} << 20);
}

TEST(Offload, WrapWithParamOffloadStartsOffloaded) {
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto model = make_model();
    auto mesh = *collective::DeviceMesh::for_fsdp(borrow(w), -1);
    WrapPolicy policy;
    FsdpOptions o;
    o.param_offload = true;
    o.optimizer_offload = true;
    auto e = FsdpModule::wrap(model, *make_units(*model, policy), mesh, o, test_optim());
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_TRUE((*e)->params_offloaded());
    EXPECT_EQ((*e)->resident_bytes(), 0);
  });
}

// Note [Clean offload]: shards that nothing wrote since load_params() are freed without being
// copied back (a marker written into the host buffer behind the engine's back survives the
// offload, also after a checkpoint save); after a step, or a checkpoint restore, offload_params()
// copies again; and training through load / read / offload cycles ends where the uninterrupted
// run ends.
TEST(Offload, UnchangedShardsAreFreedWithoutCopyingBack) {
  RunResult want = reference_run(3);
  const std::string dir = temp_dir("clean_offload");
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, true);
    const FsdpModule& view = *e;  // const access: reads that do not mark the shards written
    const int last = static_cast<int>(e->layouts().size()) - 1;
    ASSERT_TRUE(e->offload_params().ok());
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(e->load_params().ok());  // a read-only phase (a gather for the rollout, say)
      ASSERT_TRUE(e->full_state_dict(at::kFloat).ok());
      const at::Tensor host = view.unit_state(last).offload_shard;
      const at::Tensor kept = host.clone();
      host.fill_(7.0f);  // what the host buffer holds now; an unchanged shard is not copied over it
      ASSERT_TRUE(e->offload_params().ok());
      EXPECT_TRUE(at::equal(host, at::full_like(host, 7.0f))) << "step " << step << ": copied back";
      host.copy_(kept);
      ASSERT_TRUE(e->load_params().ok());  // the update: the step writes the shards
      fsdp_step(*e, w, step, true);
      const at::Tensor updated = view.unit_state(last).shard.clone();
      ASSERT_TRUE(e->offload_params().ok());
      EXPECT_TRUE(at::equal(view.unit_state(last).offload_shard, updated)) << "step " << step << ": not copied";
    }
    ASSERT_TRUE(e->load_params().ok());
    EXPECT_LE(max_relative_error(*e->full_state_dict(at::kFloat), want.params), 1e-5);
    // A checkpoint restored while offloaded lands in the host buffers; the next offload copies.
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
    const at::Tensor saved = view.unit_state(last).shard.clone();
    ASSERT_TRUE(e->offload_params().ok());
    view.unit_state(last).offload_shard.fill_(7.0f);
    Status st = load_checkpoint(*e, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(e->params_offloaded());
    EXPECT_TRUE(at::equal(view.unit_state(last).offload_shard, saved));
    for (int u = 0; u <= last; ++u) EXPECT_FALSE(view.unit_state(u).shard.defined()) << "unit " << u;
    const at::Tensor host = view.unit_state(last).offload_shard;
    ASSERT_TRUE(e->load_params().ok());  // the first offload after a restore copies
    host.fill_(7.0f);
    ASSERT_TRUE(e->offload_params().ok());
    EXPECT_TRUE(at::equal(host, saved)) << "not copied after a restore";
    ASSERT_TRUE(e->load_params().ok());  // a save only reads the shards
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
    host.fill_(7.0f);
    ASSERT_TRUE(e->offload_params().ok());
    EXPECT_TRUE(at::equal(host, at::full_like(host, 7.0f))) << "copied back after a save";
  });
  fs::remove_all(dir);
}

// Saved at world 4 after 3 steps, loaded at world 2 (and 1), 2 more steps: equals 5 steps of the
// single-process reference.
TEST(Checkpoint, SavedAtWorld4LoadedAtWorld2And1ContinuesIdentically) {
  RunResult want = reference_run(5);
  std::string dir = temp_dir("resize");
  collective::testing::with_world("inproc", 4, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, true);
    for (int s = 0; s < 3; ++s) fsdp_step(*e, w, s, true);
    Status st = save_checkpoint(*e, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
  });
  auto manifest = read_manifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
  EXPECT_EQ((*manifest)["world_size"], 4);
  EXPECT_EQ((*manifest)["shard_count"], 4);
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  for (int world : {2, 1}) {
    collective::testing::with_world("inproc", world, [&](int, Communicator& w) {
      auto e = make_engine(borrow(w), world == 1 ? S::no_shard : S::full_shard, true);
      Status st = load_checkpoint(*e, dir);
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(e->optimizer_steps(), 3);
      for (int s = 3; s < 5; ++s) {
        double loss = fsdp_step(*e, w, s, true);
        EXPECT_NEAR(loss, want.losses[s], 1e-5 * want.losses[s]) << "world " << world << " step " << s;
      }
      EXPECT_LE(max_relative_error(*e->full_state_dict(at::kFloat), want.params), 1e-5) << "world " << world;
    });
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, ErrorBeforePublicationKeepsThePreviousCheckpoint) {
  std::string dir = temp_dir("abort");
  std::map<std::string, at::Tensor> saved;
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    fsdp_step(*e, w, 0, false);
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
    auto snapshot = *e->full_state_dict(at::kFloat);
    if (rank == 0) saved = snapshot;
    fsdp_step(*e, w, 1, false);
    SaveOptions failing;
    failing.after_rank_files = [rank](const std::string&) {
      return rank == 1 ? Status(ErrorCode::io_error, "disk full (simulated)") : Status();
    };
    Status st = save_checkpoint(*e, dir, failing);
    ASSERT_FALSE(st.ok());
    if (rank == 1) {
      EXPECT_NE(st.message().find("disk full (simulated)"), std::string::npos) << st.message();
    }
    if (rank == 0) {
      EXPECT_NE(st.message().find("another rank failed"), std::string::npos) << st.message();
    }
  });
  EXPECT_TRUE(fs::exists(dir + ".tmp"));                     // the partial attempt is left aside
  EXPECT_FALSE(fs::exists(dir + ".tmp/manifest.json"));
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    ASSERT_TRUE(load_checkpoint(*e, dir).ok());
    auto now = *e->full_state_dict(at::kFloat);
    EXPECT_TRUE(all_equal(now, saved));
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());  // the next save cleans the leftovers
  });
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  fs::remove_all(dir);
}

constexpr const char* kChildDirEnv = "TESSERA_FSDP_KILL_DIR";

// A child process loads the checkpoint, trains, and is SIGKILLed after writing its files into
// the temp directory, before the manifest and the swap. The parent then loads the original.
TEST(Checkpoint, ProcessKilledMidSaveLeavesThePreviousCheckpointLoadable) {
  std::string dir = temp_dir("kill");
  std::map<std::string, at::Tensor> saved;
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    fsdp_step(*e, w, 0, false);
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
    saved = *e->full_state_dict(at::kFloat);
  });
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv(kChildDirEnv, dir.c_str(), 1);
    const char* argv[] = {"/proc/self/exe", "--gtest_filter=FsdpChild.*", nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  EXPECT_TRUE(fs::exists(dir + ".tmp/model_shard_0_of_1.safetensors"));  // it really was mid-save
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    Status st = load_checkpoint(*e, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(all_equal(*e->full_state_dict(at::kFloat), saved));
  });
  fs::remove_all(dir);
  fs::remove_all(dir + ".tmp");
}

TEST(FsdpChild, KilledMidSave) {
  const char* dir = std::getenv(kChildDirEnv);
  if (dir == nullptr) GTEST_SKIP() << "child mode only";
  ::alarm(120);
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    ASSERT_TRUE(load_checkpoint(*e, dir).ok());
    fsdp_step(*e, w, 1, false);
    SaveOptions die;
    die.after_rank_files = [](const std::string&) -> Status {
      ::raise(SIGKILL);
      return Status();
    };
    (void)save_checkpoint(*e, dir, die);
  });
  FAIL() << "the child should have been killed";
}

TEST(Checkpoint, CorruptOrForeignCheckpointsAreNamedErrors) {
  std::string dir = temp_dir("corrupt");
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
  });
  fs::resize_file(dir + "/model_shard_1_of_2.safetensors", 10);
  auto m = read_manifest(dir);
  EXPECT_EQ(m.status().code(), ErrorCode::corrupt_data);
  EXPECT_NE(m.status().message().find("'model_shard_1_of_2.safetensors' is missing or not"), std::string::npos)
      << m.status().message();
  EXPECT_EQ(read_manifest(dir + "_nothing").status().code(), ErrorCode::not_found);
  fs::remove_all(dir);
}

TEST(Checkpoint, ExportHfWritesSafetensorsAndConfig) {
  std::string dir = temp_dir("export"), out = temp_dir("export_out");
  std::map<std::string, at::Tensor> full;
  nlohmann::json config = {{"model_type", "tiny"}, {"hidden_size", kDim}, {"torch_dtype", "float32"}};
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto e = make_engine(borrow(w), S::full_shard, false);
    fsdp_step(*e, w, 0, false);
    SaveOptions o;
    o.hf_config = config;
    ASSERT_TRUE(save_checkpoint(*e, dir, o).ok());
    ASSERT_TRUE(save_checkpoint(*e, dir + "_plain").ok());
    auto f = *e->full_state_dict(at::kFloat);
    if (rank == 0) full = f;
  });
  ExportOptions eo;
  eo.dtype = at::kBFloat16;
  Status st = export_hf(dir, out, eo);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto tensors = models::read_safetensors_checkpoint(out);
  ASSERT_TRUE(tensors.ok()) << tensors.status().to_string();
  ASSERT_EQ(tensors->size(), full.size());
  for (const auto& [name, t] : full) EXPECT_TRUE(at::equal(tensors->at(name), t.to(at::kBFloat16))) << name;
  std::ifstream in(out + "/config.json");
  auto written = nlohmann::json::parse(in);
  EXPECT_EQ(written["torch_dtype"], "bfloat16");
  EXPECT_EQ(written["hidden_size"], kDim);
  EXPECT_EQ(export_hf(dir + "_plain", out + "2").code(), ErrorCode::not_found);
  fs::remove_all(dir);
  fs::remove_all(dir + "_plain");
  fs::remove_all(out);
}

// Note [Activation offload]: inputs parked in slots come back in backward's order (the last
// forward first, each one prefetched while the previous is used), each slot with its own values,
// whatever the device reuses in between; the last slot filled never leaves its device; an input
// modified in place after its forward is refused, as autograd's saved tensors refuse it; an empty
// slot is an error; clear() drops them all. On the CPU with copying on (the engine keeps host
// tensors as they are), the same bookkeeping.
void expect_parked_activations_come_back(const c10::Device& device, int64_t n) {
  internal::ActivationStash stash(/*copy_on_host=*/true);
  const int layers = 6;
  const auto options = at::TensorOptions(at::kFloat).device(device);
  for (int round = 0; round < 2; ++round) {
    at::Tensor last;
    for (int l = 0; l < layers; ++l) {
      at::Tensor x = at::full({n}, 10.0 * round + l, options);
      stash.put(static_cast<size_t>(l), x);
      if (l == layers - 1) last = x;
      // x is dropped here (but the last): the next tensors may take its memory before its copy
      // has run.
      at::Tensor pressure = at::full({n}, -7.0, options);
    }
    EXPECT_EQ(stash.size(), static_cast<size_t>(layers));
    EXPECT_EQ(stash.resident(), 1u);
    for (int l = layers - 1; l >= 0; --l) {
      at::Tensor back = stash.take(static_cast<size_t>(l));
      if (l == layers - 1) {
        EXPECT_TRUE(back.is_same(last)) << "the last layer's input never left";
      }
      if (l > 0) stash.prefetch(static_cast<size_t>(l - 1));
      at::Tensor sum = back.sum();  // read on the caller's stream after the upload
      at::Tensor scratch = at::full({n}, -1.0, back.options());
      EXPECT_EQ(back.device(), device);
      EXPECT_EQ(sum.item<double>(), (10.0 * round + l) * static_cast<double>(n)) << "round " << round << " layer " << l;
      EXPECT_TRUE(at::equal(back.cpu(), at::full({n}, 10.0 * round + l))) << "round " << round << " layer " << l;
    }
    EXPECT_EQ(stash.size(), 0u);
  }
  EXPECT_THROW(stash.take(0), std::exception);
  // In place after the forward: refused, whether the input left its device or not.
  for (int l = 0; l < 2; ++l) {
    at::Tensor x = at::ones({n}, options);
    stash.put(static_cast<size_t>(l), x);
    x.add_(1.0);
  }
  EXPECT_THROW(stash.take(1), std::exception);
  EXPECT_THROW(stash.take(0), std::exception);
  stash.put(3, at::ones({n}, options));
  stash.clear();
  EXPECT_EQ(stash.size(), 0u);
  EXPECT_THROW(stash.take(3), std::exception);
}

TEST(ActivationOffload, ParkedInputsComeBackInBackwardOrder) {
  expect_parked_activations_come_back(c10::Device(c10::DeviceType::CPU), 1024);
}

TEST(ActivationOffload, OnCudaParkedInputsComeBackInBackwardOrder) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  expect_parked_activations_come_back(c10::Device("cuda:0"), int64_t{1} << 22);  // 16 MB each
}
}  // namespace
}  // namespace tessera::fsdp
