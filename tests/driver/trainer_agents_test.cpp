// The same GRPO run on 2 local agent processes (deploy/local-cluster.sh 2) and embedded in the
// driver gives the same metrics for the same seed: placement changes where the ranks run, not
// what they compute. The run uses rollout tensor parallelism 2 (verl's default), so across agents
// the TP slices travel between processes (Gloo sub-groups, the all-to-all of the FSDP shards) and
// the attention/MLP all-reduces cross the process boundary; TP=2 == TP=1 itself is tested in
// worker_test (RolloutTensorParallel). Then split placement across the agents against the
// colocated hybrid engine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "driver/ppo_trainer.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::driver {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::vector<std::pair<int64_t, Metrics>> fit(const std::vector<std::string>& overrides) {
  auto t = testing::fit_trainer(overrides);
  return t ? t->history() : std::vector<std::pair<int64_t, Metrics>>{};
}

// Starts `deploy/local-cluster.sh 2` in `dir` and stops it when destroyed.
class LocalCluster {
 public:
  LocalCluster(const fs::path& source, const fs::path& bin, const fs::path& dir)
      : script_((source / "deploy" / "local-cluster.sh").string()), dir_(dir.string()) {
    std::string cmd = "TESSERA_BIN='" + (bin / "tessera").string() + "' bash '" + script_ +
                      "' 2 --devices cpu:2 --dir '" + dir_ + "' 2>/dev/null | tail -n1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return;
    char buf[1024];
    while (std::fgets(buf, sizeof buf, p) != nullptr) line_ += buf;
    ::pclose(p);
    while (!line_.empty() && (line_.back() == '\n' || line_.back() == '\r')) line_.pop_back();
  }
  ~LocalCluster() {
    std::string cmd = "bash '" + script_ + "' stop --dir '" + dir_ + "' >/dev/null 2>&1";
    (void)std::system(cmd.c_str());
  }
  /// The two overrides the script printed ("cluster.agents=[...]", "cluster.token_file=...").
  std::vector<std::string> overrides() const {
    auto space = line_.find(' ');
    if (line_.rfind("cluster.agents=", 0) != 0 || space == std::string::npos) return {};
    return {line_.substr(0, space), line_.substr(space + 1)};
  }
  const std::string& line() const { return line_; }

 private:
  std::string script_, dir_, line_;
};

TEST(TrainerAgents, GrpoOnTwoLocalAgentsMatchesEmbedded) {
  const char* source = std::getenv("TESSERA_SOURCE_DIR");
  const char* bin = std::getenv("TESSERA_BIN_DIR");
  if (source == nullptr || bin == nullptr || !fs::exists(fs::path(bin) / "tessera")) {
    GTEST_SKIP() << "needs TESSERA_SOURCE_DIR and the tessera binary in TESSERA_BIN_DIR";
  }
  TempDir dir("agents");
  testing::make_tiny_run(dir.path());
  std::vector<std::string> base = testing::tiny_ppo_overrides(dir.path(), "grpo", 2);
  base.push_back("actor_rollout_ref.rollout.tensor_model_parallel_size=2");

  std::vector<std::string> embedded = base;
  embedded.push_back("trainer.default_local_dir=" + (dir.path() / "run_embedded").string());
  auto expected = fit(embedded);

  LocalCluster cluster(source, bin, dir.path() / "cluster");
  ASSERT_EQ(cluster.overrides().size(), 2u) << "local-cluster.sh printed: " << cluster.line();
  std::vector<std::string> on_agents = base;
  on_agents.push_back("trainer.default_local_dir=" + (dir.path() / "run_agents").string());
  on_agents.push_back("trainer.nnodes=2");
  on_agents.push_back("trainer.n_gpus_per_node=1");
  for (const std::string& o : cluster.overrides()) on_agents.push_back(o);
  auto got = fit(on_agents);

  ASSERT_EQ(expected.size(), 3u);  // validation before training + 2 steps
  testing::expect_same_history(expected, got);

  // Split placement across the agents: the actor on each agent's cpu:0, the rollout on its cpu:1;
  // every sync moves the FSDP shards between the processes over the data plane. Same metrics as
  // the colocated hybrid engine embedded.
  std::vector<std::string> colocated = base, split = base;
  for (auto* run : {&colocated, &split}) run->push_back("actor_rollout_ref.rollout.tensor_model_parallel_size=1");
  colocated.push_back("trainer.default_local_dir=" + (dir.path() / "run_colocated").string());
  auto want_split = fit(colocated);
  split.push_back("trainer.default_local_dir=" + (dir.path() / "run_split").string());
  split.push_back("actor_rollout_ref.rollout.engine_kwargs.tessera.placement=split");
  split.push_back("trainer.nnodes=2");
  split.push_back("trainer.n_gpus_per_node=1");
  for (const std::string& o : cluster.overrides()) split.push_back(o);
  auto split_trainer = testing::fit_trainer(split);
  ASSERT_NE(split_trainer, nullptr);
  ASSERT_NE(split_trainer->rollout_wg(), nullptr);  // the rollout really ran as its own group
  EXPECT_EQ(split_trainer->rollout_wg()->world_size(), 2);
  ASSERT_EQ(want_split.size(), 3u);
  testing::expect_same_history(want_split, split_trainer->history());

  // The same with LoRA and a KL loss: the reference is the actor group's (verl's ref_in_actor,
  // role "actor" under split placement), and the rollout group merges the adapters it receives.
  for (auto* run : {&colocated, &split}) {
    for (const char* o : {"actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                          "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr=5e-2"}) {
      run->push_back(o);
    }
  }
  colocated.push_back("trainer.default_local_dir=" + (dir.path() / "run_lora_colocated").string());
  split.push_back("trainer.default_local_dir=" + (dir.path() / "run_lora_split").string());
  auto want_lora = fit(colocated);
  auto split_lora = testing::fit_trainer(split);
  ASSERT_NE(split_lora, nullptr);
  ASSERT_NE(split_lora->rollout_wg(), nullptr);
  ASSERT_EQ(want_lora.size(), 3u);
  EXPECT_TRUE(want_lora[1].second.count("actor/kl_loss"));
  testing::expect_same_history(want_lora, split_lora->history());

  // Ulysses sequence parallelism across the agents (Note [Ulysses sequence parallelism]): one group
  // of the two processes splits every packed micro-batch's tokens, its all-to-alls and gathers
  // over Gloo between the processes; the same run as 2 data-parallel ranks embedded.
  std::vector<std::string> data_parallel = base, ulysses = base;
  for (auto* run : {&data_parallel, &ulysses}) {
    run->push_back("actor_rollout_ref.model.use_remove_padding=true");
    run->push_back("actor_rollout_ref.actor.use_kl_loss=true");
  }
  data_parallel.push_back("trainer.default_local_dir=" + (dir.path() / "run_dp").string());
  ulysses.push_back("trainer.default_local_dir=" + (dir.path() / "run_ulysses").string());
  ulysses.push_back("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2");
  ulysses.push_back("trainer.nnodes=2");
  ulysses.push_back("trainer.n_gpus_per_node=1");
  for (const std::string& o : cluster.overrides()) ulysses.push_back(o);
  auto want_ulysses = fit(data_parallel);
  ASSERT_EQ(want_ulysses.size(), 3u);
  testing::expect_same_history(want_ulysses, fit(ulysses));
}

}  // namespace
}  // namespace tessera::driver
