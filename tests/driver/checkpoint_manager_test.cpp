// Checkpoint bookkeeping: layout, marker atomicity, pruning, resume resolution.
#include <gtest/gtest.h>

#include <fstream>

#include "driver/checkpoint_manager.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

CheckpointOptions opts(const fs::path& root, std::optional<int64_t> keep_actor = std::nullopt,
                       std::optional<int64_t> keep_critic = std::nullopt) {
  CheckpointOptions o;
  o.default_local_dir = root;
  o.max_actor_ckpt_to_keep = keep_actor;
  o.max_critic_ckpt_to_keep = keep_critic;
  return o;
}

// What a trainer does for one save: worker dirs, driver state, commit.
void save(CheckpointManager& m, int64_t step) {
  auto dir = m.begin_save(step);
  ASSERT_TRUE(dir.ok()) << dir.status().to_string();
  fs::create_directories(m.actor_dir(step));
  fs::create_directories(m.critic_dir(step));
  std::ofstream(m.actor_dir(step) / "model_world_size_1_rank_0.pt") << "w";
  ASSERT_TRUE(m.write_driver_state(step, {{"epoch", 0}, {"batch_index", step}}, {{"global_steps", step}}).ok());
  ASSERT_TRUE(m.commit(step).ok());
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(CheckpointManager, LayoutAndMarker) {
  testing::TempDir dir("ckpt");
  CheckpointManager m(opts(dir.path()));
  EXPECT_FALSE(m.latest_checkpointed_iteration()->has_value());
  save(m, 5);
  EXPECT_EQ(read(dir.path() / "latest_checkpointed_iteration.txt"), "5");
  EXPECT_TRUE(fs::exists(dir.path() / "global_step_5" / "data.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "global_step_5" / "trainer_state.json"));
  EXPECT_EQ(**m.latest_checkpointed_iteration(), 5);
  // No temporary files are left behind.
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST(CheckpointManager, CrashBeforeCommitKeepsThePreviousMarker) {
  testing::TempDir dir("ckpt_crash");
  CheckpointManager m(opts(dir.path()));
  save(m, 2);
  // Step 4 is interrupted after the workers wrote but before the driver state and commit.
  ASSERT_TRUE(m.begin_save(4).ok());
  fs::create_directories(m.actor_dir(4));
  EXPECT_EQ(**m.latest_checkpointed_iteration(), 2);
  EXPECT_EQ(*m.complete_steps(), std::vector<int64_t>{2});
  auto resume = m.resolve_resume();
  ASSERT_TRUE(resume.ok());
  EXPECT_EQ((*resume)->global_step, 2);
  // Committing a step without its driver state is refused; begin_save clears the stale dir.
  EXPECT_FALSE(m.commit(4).ok());
  std::ofstream(m.actor_dir(4) / "stale") << "x";
  ASSERT_TRUE(m.begin_save(4).ok());
  EXPECT_FALSE(fs::exists(m.actor_dir(4) / "stale"));
  // A corrupt marker is an error naming it.
  std::ofstream(dir.path() / "latest_checkpointed_iteration.txt") << "garbage";
  auto bad = m.resolve_resume();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("latest_checkpointed_iteration.txt"), std::string::npos);
}

TEST(CheckpointManager, PrunesOldActorAndCriticDirs) {
  testing::TempDir dir("ckpt_prune");
  CheckpointManager m(opts(dir.path(), /*keep_actor=*/2, /*keep_critic=*/1));
  for (int64_t s : {1, 2, 3, 4}) save(m, s);
  EXPECT_FALSE(fs::exists(dir.path() / "global_step_1"));  // neither actor nor critic left
  EXPECT_FALSE(fs::exists(dir.path() / "global_step_2"));
  EXPECT_TRUE(fs::exists(m.actor_dir(3)));
  EXPECT_FALSE(fs::exists(m.critic_dir(3)));
  EXPECT_TRUE(fs::exists(m.actor_dir(4)));
  EXPECT_TRUE(fs::exists(m.critic_dir(4)));
  CheckpointManager keep_all(opts(dir.path() / "all"));
  for (int64_t s : {1, 2, 3}) save(keep_all, s);
  EXPECT_EQ(*keep_all.complete_steps(), (std::vector<int64_t>{1, 2, 3}));
}

TEST(CheckpointManager, ResumeModes) {
  testing::TempDir dir("ckpt_resume");
  CheckpointManager m(opts(dir.path()));
  save(m, 3);
  auto o = opts(dir.path());
  o.resume_mode = "disable";
  EXPECT_FALSE(CheckpointManager(o).resolve_resume()->has_value());
  o.resume_mode = "auto";
  auto autop = CheckpointManager(o).resolve_resume();
  ASSERT_TRUE(autop.ok() && autop->has_value());
  EXPECT_EQ((*autop)->global_step, 3);
  EXPECT_EQ((*autop)->dataloader_state["batch_index"], 3);
  EXPECT_EQ((*autop)->trainer_state["global_steps"], 3);
  o.default_local_dir = dir.path() / "empty";
  EXPECT_FALSE(CheckpointManager(o).resolve_resume()->has_value());  // auto, nothing saved: scratch
  o.resume_mode = "resume_path";
  o.resume_from_path = (dir.path() / "global_step_3").string();
  auto path = CheckpointManager(o).resolve_resume();
  ASSERT_TRUE(path.ok() && path->has_value()) << path.status().to_string();
  EXPECT_EQ((*path)->global_step, 3);
  o.resume_from_path = (dir.path() / "somewhere").string();
  auto bad = CheckpointManager(o).resolve_resume();
  EXPECT_NE(bad.status().message().find("global_step_N"), std::string::npos);
  o.resume_from_path = (dir.path() / "global_step_9").string();
  auto missing = CheckpointManager(o).resolve_resume();
  EXPECT_NE(missing.status().message().find("global_step_9"), std::string::npos);
  EXPECT_EQ(*parse_global_step("/x/global_step_12"), 12);
  EXPECT_FALSE(parse_global_step("/x/global_step_").ok());
}

}  // namespace
}  // namespace tessera::driver
