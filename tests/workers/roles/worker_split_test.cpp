// Split placement (workers/rollout/split_weights.hpp): the FSDP shards travel to rollout ranks on
// other devices in buckets and are reassembled there by reference; a rollout group on its own
// devices, fed through futures between groups, generates exactly what the colocated hybrid engine
// generates, before and after an actor update.
#include "dispatch/worker_group.hpp"
#include "runtime/runtime.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/fsdp/units.hpp"
#include "workers/models/lora.hpp"
#include "workers/models/model_io.hpp"
#include "workers/roles/registry.hpp"
#include "workers/rollout/kv_engine.hpp"
#include "workers/rollout/split_weights.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT
using dispatch::Value;
using dispatch::WorkerGroup;

// A float32 KV-cache engine over `shell` (prompts of 8, responses of 6).
Result<std::unique_ptr<rollout::KVCacheEngine>> tiny_engine(std::shared_ptr<models::CausalLM> shell) {
  rollout::RolloutConfig rc;
  rc.dtype = "float32";
  rc.prompt_length = 8;
  rc.response_length = 6;
  return rollout::KVCacheEngine::create(std::move(shell), rc);
}

// Whether `t`'s bytes lie inside one of `buffers`.
bool inside_any(const at::Tensor& t, const std::vector<at::Tensor>& buffers) {
  const auto* p = static_cast<const char*>(t.data_ptr());
  for (const auto& buf : buffers) {
    const auto* lo = static_cast<const char*>(buf.data_ptr());
    if (p >= lo && p + t.numel() * t.element_size() <= lo + buf.numel() * buf.element_size()) return true;
  }
  return false;
}

// Two FSDP ranks export one unit per bucket; the rows of both ranks (what the rollout pulls through
// the future) rebuild every parameter exactly, as views of the importer's buffers.
TEST(SplitWeights, BucketsFromTwoShardsRebuildTheModelByReference) {
  const auto want = load_tiny_model()->parameter_map();
  std::vector<std::vector<proto::DataProto>> parts(2);  // [rank][bucket]
  int64_t buckets = 0;
  const uint16_t port = next_port();
  run_ranks(2, [&](int r) {
    auto world = world_communicator(context(r, 2, port), "inproc");
    ASSERT_TRUE(world.ok()) << world.status().to_string();
    FsdpBuildOptions b;
    b.fsdp_config = fp32_fsdp();
    auto module = build_fsdp_module(load_tiny_model(), *world, b);
    ASSERT_TRUE(module.ok()) << module.status().to_string();
    rollout::WeightExporter exporter((*module)->engine(), at::kFloat, /*bucket_bytes=*/1);  // a unit per bucket
    buckets = exporter.buckets();
    EXPECT_EQ(buckets, static_cast<int64_t>((*module)->engine().layouts().size()));
    for (int64_t i = 0; i < exporter.buckets(); ++i) {
      auto part = exporter.export_bucket(i, /*version=*/7);
      ASSERT_TRUE(part.ok()) << part.status().to_string();
      EXPECT_EQ(part->size(), 1);  // FULL_SHARD: both ranks hold distinct shards
      parts[static_cast<size_t>(r)].push_back(*part);
    }
    // With the shards offloaded (param_offload), the buckets come from the host buffers, the
    // same bytes, and nothing is loaded back onto the device.
    fsdp::FsdpModule& engine = (*module)->engine();
    ASSERT_TRUE(engine.offload_params().ok());
    for (int64_t i = 0; i < exporter.buckets(); ++i) {
      auto part = exporter.export_bucket(i, /*version=*/7);
      ASSERT_TRUE(part.ok()) << part.status().to_string();
      EXPECT_TRUE(engine.params_offloaded());
      for (const auto& [key, t] : parts[static_cast<size_t>(r)][static_cast<size_t>(i)].batch()) {
        EXPECT_TRUE(at::equal(*part->tensor(key), t)) << "bucket " << i << " " << key;
      }
    }
  });
  ASSERT_GT(buckets, 1);
  auto shell = models::CausalLM::create(tiny_model_config(), models::ModelInit{at::kFloat, 0});
  ASSERT_TRUE(shell.ok());
  auto engine = tiny_engine(*shell);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  rollout::WeightImporter importer(**engine);
  auto bucket = [&](int64_t i) { return *proto::DataProto::concat({parts[0][i], parts[1][i]}); };
  // Out of order: refused, nothing changes.
  Status st = importer.import_bucket(bucket(1));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("expected bucket 0"), std::string::npos) << st.to_string();
  for (int64_t i = 0; i < buckets; ++i) {
    ASSERT_TRUE(importer.import_bucket(bucket(i)).ok());
    EXPECT_EQ(importer.version(), i + 1 == buckets ? 7 : -1);  // the engine switches after the last bucket
  }
  for (const auto& [name, t] : (*shell)->parameter_map()) {
    EXPECT_TRUE(at::equal(t, want.at(name))) << name;
    const bool inside = inside_any(t, importer.buffers());
    EXPECT_TRUE(inside) << name << " is not a view of the transferred buffers";
  }
  proto::DataProto bad = bucket(0);
  bad.meta_info().erase("tessera_weights");
  EXPECT_EQ(importer.import_bucket(bad).code(), ErrorCode::corrupt_data);
  EXPECT_EQ(importer.version(), 7);
}

// LoRA adapters (one unit per bucket, so they arrive in other buckets than their base weights)
// are merged on import: the engine's weights equal the merged state, as views of buffers of the
// importer's own (the adapters' buffers let go), and the received rows are left as they came.
TEST(SplitWeights, LoraAdaptersAreMergedIntoBuffersOfTheImportersOwn) {
  constexpr double kScaling = 2.0;  // alpha 8 / rank 4
  std::vector<std::vector<proto::DataProto>> parts(2);
  models::TensorMap want;
  size_t base_units = 0;
  const uint16_t port = next_port();
  run_ranks(2, [&](int r) {
    auto world = world_communicator(context(r, 2, port), "inproc");
    ASSERT_TRUE(world.ok()) << world.status().to_string();
    auto model = load_tiny_model();
    models::LoraConfig lora;
    lora.rank = 4;
    lora.alpha = 8;
    lora.target.all_linear = true;
    ASSERT_TRUE(models::apply_lora(*model, lora, "model").ok());
    {
      torch::NoGradGuard no_grad;
      at::Generator gen = at::detail::createCPUGenerator(3);
      for (auto& item : model->named_parameters()) {
        if (item.key().find(".lora_B.") != std::string::npos) item.value().copy_(at::randn(item.value().sizes(), gen) * 0.1);
      }
    }
    FsdpBuildOptions b;
    b.fsdp_config = fp32_fsdp();
    b.optim = json{{"lr", 1e-3}};
    auto module = build_fsdp_module(model, *world, b);
    ASSERT_TRUE(module.ok()) << module.status().to_string();
    auto state = (*module)->engine().full_state_dict(at::kFloat);
    ASSERT_TRUE(state.ok());
    rollout::WeightExporter exporter((*module)->engine(), at::kFloat, /*bucket_bytes=*/1);
    for (int64_t i = 0; i < exporter.buckets(); ++i) {
      auto part = exporter.export_bucket(i, /*version=*/3);
      ASSERT_TRUE(part.ok()) << part.status().to_string();
      parts[static_cast<size_t>(r)].push_back(*part);
    }
    if (r != 0) return;
    auto merged = models::merge_lora_weights(*state, kScaling, /*in_place=*/false);
    ASSERT_TRUE(merged.ok());
    want = *merged;
    for (const auto& l : (*module)->engine().layouts()) base_units += fsdp::is_adapter_unit(l) ? 0 : 1;
  });
  auto shell = models::CausalLM::create(tiny_model_config(), models::ModelInit{at::kFloat, 0});
  ASSERT_TRUE(shell.ok());
  auto engine = tiny_engine(*shell);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  rollout::WeightImporter importer(**engine, kScaling);
  std::vector<proto::DataProto> buckets;
  std::vector<std::map<std::string, at::Tensor>> sent;
  for (size_t i = 0; i < parts[0].size(); ++i) {
    buckets.push_back(*proto::DataProto::concat({parts[0][i], parts[1][i]}));
    std::map<std::string, at::Tensor> copy;
    for (const auto& [key, t] : buckets.back().batch()) copy[key] = t.clone();
    sent.push_back(copy);
  }
  for (const auto& b : buckets) ASSERT_TRUE(importer.import_bucket(b).ok());
  EXPECT_EQ(importer.version(), 3);
  EXPECT_EQ(importer.buffers().size(), base_units);
  for (const auto& [name, t] : (*shell)->parameter_map()) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_TRUE(at::equal(t, want.at(name))) << name;
    const bool inside = inside_any(t, importer.buffers());
    EXPECT_TRUE(inside) << name << " is not a view of the importer's buffers";
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    for (const auto& [key, t] : buckets[i].batch()) EXPECT_TRUE(at::equal(t, sent[i].at(key))) << "bucket " << i << " " << key;
  }
}

// What the trainer does before a split rollout generates (RayPPOTrainer::sync_rollout_weights).
void sync(WorkerGroup& actor, WorkerGroup& rollout, int64_t version) {
  auto plan = actor.call("rollout_weight_buckets", {});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const int64_t buckets = plan->list().at(0).json().at("buckets").get<int64_t>();
  for (int64_t b = 0; b < buckets; ++b) {
    auto fut = actor.call_async("export_rollout_weights", {Value(json{{"bucket", b}, {"version", version}})});
    ASSERT_TRUE(fut.ok()) << fut.status().to_string();
    auto done = rollout.call("load_rollout_weights", {dispatch::make_future(*fut)});
    ASSERT_TRUE(done.ok()) << done.status().to_string();
  }
}

// With LoRA (model.lora_rank) the adapters travel with the weights and the rollout group merges
// them as the colocated engine does: the same tokens and log-probs, bitwise.
class SplitPlacement : public ::testing::TestWithParam<bool> {};

TEST_P(SplitPlacement, RolloutGroupOnOtherDevicesGeneratesLikeTheHybridEngine) {
  const bool lora = GetParam();
  runtime::RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:4";
  auto rt = runtime::Runtime::start(cfg, worker_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto all = (*rt)->resource_pool();
  ASSERT_TRUE(all.ok());
  auto devices = [&](int from) {
    runtime::NodeDevices n = all->nodes().at(0);
    n.devices = {"cpu:" + std::to_string(from), "cpu:" + std::to_string(from + 1)};
    return runtime::ResourcePool::make({n});
  };
  json config = arr_config(/*mini=*/4, /*micro=*/1);
  if (lora) {
    config["model"]["lora_rank"] = 4;
    config["model"]["lora_alpha"] = 8;
    config["actor"]["optim"]["lr"] = 5e-2;
  }
  const std::string actor_init = json{{"role", "actor_rollout"}, {"config", config}, {"seed", 1}}.dump();
  config["rollout"]["engine_kwargs"] = {{"tessera", {{"placement", "split"}}}};
  const std::string rollout_init = json{{"role", "rollout"}, {"config", config}, {"seed", 1}}.dump();
  auto actor_pool = WorkerGroup::spawn(**rt, "actor_pool", *devices(0), {{"actor_rollout", "actor_rollout_ref", actor_init}});
  auto rollout_pool = WorkerGroup::spawn(**rt, "rollout_pool", *devices(2), {{"rollout", "actor_rollout_ref", rollout_init}});
  ASSERT_TRUE(actor_pool.ok() && rollout_pool.ok());
  auto actor = (*actor_pool)->role("actor_rollout");
  auto rollout = (*rollout_pool)->role("rollout");
  ASSERT_TRUE(actor.ok() && rollout.ok());
  ASSERT_TRUE((*actor)->call("init_model", {}).ok());
  auto init = (*rollout)->call("init_model", {});
  ASSERT_TRUE(init.ok()) << init.status().to_string();

  proto::DataProto prompts = make_prompts({3, 8, 5, 1}, 8, 41, kVocab);
  auto before_sync = (*rollout)->call("generate_sequences", {Value(prompts)});
  ASSERT_FALSE(before_sync.ok());  // no weights yet: a clear error, not garbage
  EXPECT_NE(before_sync.status().message().find("no weights yet"), std::string::npos) << before_sync.status().to_string();
  for (int64_t version : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "weights version " << version);
    sync(**actor, **rollout, version);
    auto colocated = (*actor)->call("generate_sequences", {Value(prompts)});
    auto split = (*rollout)->call("generate_sequences", {Value(prompts)});
    ASSERT_TRUE(colocated.ok() && split.ok()) << split.status().to_string();
    EXPECT_TRUE(at::equal(*split->proto().tensor("responses"), *colocated->proto().tensor("responses")));
    EXPECT_EQ(max_diff(*split->proto().tensor("rollout_log_probs"), *colocated->proto().tensor("rollout_log_probs")), 0.0);
    // An update changes the actor's weights; the next sync carries them over.
    proto::DataProto batch = colocated->proto();
    batch.meta_info().erase("metrics");
    auto response_mask = batch.tensor("attention_mask")->narrow(1, 8, 6).clone();
    ASSERT_TRUE(batch.set_tensor("response_mask", response_mask).ok());
    ASSERT_TRUE(batch.set_tensor("advantages", at::randn(response_mask.sizes()) * response_mask).ok());
    batch.meta_info()["temperature"] = 1.0;
    auto upd = (*actor)->call("update_actor", {Value(batch)});
    ASSERT_TRUE(upd.ok()) << upd.status().to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, SplitPlacement, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "lora" : "full"; });

}  // namespace
}  // namespace tessera::workers
