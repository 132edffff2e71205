// Frozen wraps (FsdpOptions::frozen: reference policy, reward model): no AdamW moments (0 bytes,
// against 2 x 4 bytes per shard element for a trainable wrap) and no gradient buffers; forward
// results bitwise equal to a trainable wrap's; training calls fail with one line naming the
// module; optimizer offload / load are no-ops; checkpoints hold no optimizer files and round-trip,
// a frozen module loads a trainable checkpoint, a trainable one refuses a frozen checkpoint, and
// manifests written before the "optimizer_state" field still load.
#include <filesystem>
#include <fstream>

#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "workers/fsdp/checkpoint.hpp"

namespace tessera::fsdp {
namespace {

using namespace testing;
using collective::Communicator;
namespace fs = std::filesystem;

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

std::string temp_dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "tessera_fsdp_frozen_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::remove_all(dir + ".tmp");
  return dir;
}

struct WrapArgs {
  bool frozen = true;
  uint64_t seed = 1234;
  bool optimizer_offload = false;
  bool recompute = false;
};

WrapArgs args(bool frozen, uint64_t seed = 1234, bool optimizer_offload = false, bool recompute = false) {
  WrapArgs a;
  a.frozen = frozen;
  a.seed = seed;
  a.optimizer_offload = optimizer_offload;
  a.recompute = recompute;
  return a;
}

// A TinyLM engine under FULL_SHARD; a frozen one is named "ref.fsdp_config". Its parameters keep
// requires_grad: the option alone must keep the wrap free of optimizer state and gradients.
std::unique_ptr<FsdpModule> wrap_tiny(std::shared_ptr<Communicator> world, const WrapArgs& a) {
  auto model = make_model(a.seed);
  WrapPolicy policy;
  policy.transformer_layer_cls_to_wrap = {"TinyBlockImpl"};
  auto units = make_units(*model, policy, a.recompute);
  EXPECT_TRUE(units.ok());
  FsdpOptions o;
  o.mixed_precision.param_dtype = at::kFloat;
  o.frozen = a.frozen;
  o.optimizer_offload = a.optimizer_offload;
  o.name = a.frozen ? "ref.fsdp_config" : "actor.fsdp_config";
  auto e = FsdpModule::wrap(model, *units, *collective::DeviceMesh::for_fsdp(world, -1), o, test_optim());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

bool all_of_equal(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    if (!b.count(k) || !at::equal(v, b.at(k))) return false;
  }
  return true;
}

int64_t shard_bytes(const FsdpModule& e) {
  int64_t total = 0;
  for (size_t u = 0; u < e.layouts().size(); ++u) total += e.shard(static_cast<int>(u)).numel() * 4;
  return total;
}

// Logits of an eval forward (layers through run_unit when `runner`).
at::Tensor eval_logits(FsdpModule& e, int step, int rank, int world, bool runner) {
  Batch b = make_batch(step).slice(rank, world);
  EXPECT_TRUE(e.begin_forward(ForwardMode::eval).ok());
  LayerRunner run = [&](int i, const TinyBlock& block, const at::Tensor& h) {
    TinyBlock blk = block;
    auto out = e.run_unit(i, [blk](const at::Tensor& x) mutable { return blk->forward(x); }, h);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return *out;
  };
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model_of(e).forward(b.ids, runner ? run : nullptr);
  }
  EXPECT_TRUE(e.end_forward().ok());
  return logits;
}

TEST(Frozen, WrapHoldsNoOptimizerStateAndOffloadIsANoOp) {
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto trainable = wrap_tiny(borrow(w), args(false));
    auto frozen = wrap_tiny(borrow(w), args(true));
    ASSERT_TRUE(trainable && frozen);
    EXPECT_FALSE(trainable->frozen());
    EXPECT_TRUE(frozen->frozen());
    EXPECT_EQ(trainable->optimizer_state_bytes(), 2 * shard_bytes(*trainable));  // exp_avg + exp_avg_sq
    EXPECT_EQ(frozen->optimizer_state_bytes(), 0);
    EXPECT_EQ(frozen->resident_bytes(), shard_bytes(*frozen));
    for (size_t u = 0; u < frozen->layouts().size(); ++u) {
      EXPECT_FALSE(frozen->unit_state(static_cast<int>(u)).trainable);
    }
    ASSERT_TRUE(frozen->offload_optimizer().ok());
    EXPECT_FALSE(frozen->optimizer_offloaded());
    ASSERT_TRUE(frozen->load_optimizer().ok());
    EXPECT_EQ(frozen->optimizer_state_bytes(), 0);
    // optimizer_offload at wrap (verl's flag on a ref block) is accepted and does nothing.
    auto offloaded = wrap_tiny(borrow(w), args(true, 1234, true));
    ASSERT_TRUE(offloaded);
    EXPECT_FALSE(offloaded->optimizer_offloaded());
    EXPECT_EQ(offloaded->optimizer_state_bytes(), 0);
  });
}

TEST(Frozen, ForwardEqualsTrainableWrapBitwise) {
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    for (bool recompute : {false, true}) {
      auto trainable = wrap_tiny(borrow(w), args(false, 1234, false, recompute));
      auto frozen = wrap_tiny(borrow(w), args(true, 1234, false, recompute));
      ASSERT_TRUE(trainable && frozen);
      for (int step = 0; step < 2; ++step) {
        at::Tensor want = eval_logits(*trainable, step, rank, 2, recompute);
        at::Tensor got = eval_logits(*frozen, step, rank, 2, recompute);
        EXPECT_TRUE(at::equal(got, want)) << "recompute " << recompute << " step " << step;
      }
      EXPECT_TRUE(frozen->gathered_units().empty());
    }
  });
}

TEST(Frozen, TrainingCallsFailWithOneLineNamingTheModule) {
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto e = wrap_tiny(borrow(w), args(true));
    ASSERT_TRUE(e);
    auto check = [](const Status& st, const std::string& call) {
      ASSERT_FALSE(st.ok()) << call;
      const std::string& m = st.message();
      EXPECT_NE(m.find("FSDP " + call + ": module 'ref.fsdp_config' is frozen"), std::string::npos) << m;
      EXPECT_NE(m.find("3 units 'layers.0' .. 'root'"), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    };
    check(e->step().status(), "step");
    check(e->begin_forward(ForwardMode::train), "begin_forward(train)");
    // backward() after an eval forward is refused as frozen too, and the pass can still end.
    ASSERT_TRUE(e->begin_forward(ForwardMode::eval).ok());
    at::Tensor loss = lm_loss(model_of(*e).forward(make_batch(0).slice(rank, 2).ids),
                              make_batch(0).slice(rank, 2).targets);
    check(e->backward(loss), "backward");
    ASSERT_TRUE(e->end_forward().ok());
    EXPECT_EQ(e->optimizer_state_bytes(), 0);
    for (size_t u = 0; u < e->layouts().size(); ++u) {
      EXPECT_FALSE(e->unit_state(static_cast<int>(u)).shard_grad.defined());
    }
  });
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Frozen, CheckpointRoundTripsWithoutOptimizerFiles) {
  std::string dir = temp_dir("ref");
  std::map<std::string, at::Tensor> saved;
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto e = wrap_tiny(borrow(w), args(true, 1234));
    Status st = save_checkpoint(*e, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto full = e->full_state_dict(at::kFloat);
    ASSERT_TRUE(full.ok());
    if (rank == 0) saved = *full;
  });
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{
                               "extra_state_rank_0_of_2.safetensors", "extra_state_rank_1_of_2.safetensors",
                               "manifest.json", "model_shard_0_of_2.safetensors", "model_shard_1_of_2.safetensors"}));
  auto manifest = read_manifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
  EXPECT_EQ((*manifest)["optimizer_state"], false);
  // Another world size, other initial weights: loading restores the saved ones exactly.
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto e = wrap_tiny(borrow(w), args(true, 99));
    ASSERT_FALSE(all_of_equal(*e->full_state_dict(at::kFloat), saved));
    Status st = load_checkpoint(*e, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(all_of_equal(*e->full_state_dict(at::kFloat), saved));
    EXPECT_EQ(e->optimizer_state_bytes(), 0);
    // A trainable module cannot take its optimizer state from a frozen checkpoint.
    auto t = wrap_tiny(borrow(w), args(false, 99));
    st = load_checkpoint(*t, dir);
    EXPECT_NE(st.message().find("saved from a frozen module (no optimizer state)"), std::string::npos)
        << st.message();
  });
  fs::remove_all(dir);
}

TEST(Frozen, LoadsTrainableCheckpointsIncludingOlderManifests) {
  std::string dir = temp_dir("actor");
  std::map<std::string, at::Tensor> saved;
  std::vector<at::Tensor> moments;
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto e = wrap_tiny(borrow(w), args(false));
    fsdp_step(*e, w, 0, false);
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
    saved = *e->full_state_dict(at::kFloat);
    for (size_t u = 0; u < e->layouts().size(); ++u) moments.push_back(e->unit_state(static_cast<int>(u)).adam.exp_avg.clone());
  });
  EXPECT_TRUE(fs::exists(dir + "/optim_shard_0_of_1.safetensors"));
  // A manifest from before frozen modules has no "optimizer_state" field: it means true.
  auto manifest = read_manifest(dir);
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ((*manifest)["optimizer_state"], true);
  manifest->erase("optimizer_state");
  {
    std::ofstream out(dir + "/manifest.json", std::ios::trunc);
    out << manifest->dump(1);
  }
  collective::testing::with_world("inproc", 2, [&](int, Communicator& w) {
    auto frozen = wrap_tiny(borrow(w), args(true, 7));
    Status st = load_checkpoint(*frozen, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(all_of_equal(*frozen->full_state_dict(at::kFloat), saved));
    EXPECT_EQ(frozen->optimizer_state_bytes(), 0);  // the optimizer files are not read
  });
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto trainable = wrap_tiny(borrow(w), args(false, 7));
    Status st = load_checkpoint(*trainable, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(all_of_equal(*trainable->full_state_dict(at::kFloat), saved));
    for (size_t u = 0; u < moments.size(); ++u) {
      EXPECT_TRUE(at::equal(trainable->unit_state(static_cast<int>(u)).adam.exp_avg, moments[u]));
    }
  });
  // A malformed flag is corrupt data, named.
  manifest->operator[]("optimizer_state") = "yes";
  {
    std::ofstream out(dir + "/manifest.json", std::ios::trunc);
    out << manifest->dump(1);
  }
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto frozen = wrap_tiny(borrow(w), args(true));
    Status st = load_checkpoint(*frozen, dir);
    EXPECT_NE(st.message().find("optimizer_state is not a boolean"), std::string::npos) << st.message();
  });
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::fsdp
