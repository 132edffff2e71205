// Loggers: console line, jsonl rows (one object per step, each step once across resumes), backend
// names (verl's `file`, refused trackers), progress bar, start-up summary.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "driver/logger.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

std::vector<json> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(Logger, JsonlAppendsOneObjectPerStep) {
  testing::TempDir dir("jsonl");
  {
    auto t = Tracking::create({"jsonl"}, dir.path() / "run");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.5}, {"timing_s/step", 1.25}}, 1).ok());
    // Visible before the logger is closed: flushed per line.
    EXPECT_EQ(read_lines(dir.path() / "run" / "metrics.jsonl").size(), 1u);
    ASSERT_TRUE(t->log({{"critic/score/mean", NAN}}, 2).ok());
  }
  {
    auto t = Tracking::create({"file"}, dir.path() / "run");  // verl's name; a resumed run appends
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.75}}, 3).ok());
  }
  auto rows = read_lines(dir.path() / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], json({{"step", 1}, {"critic/score/mean", 0.5}, {"timing_s/step", 1.25}}));
  EXPECT_TRUE(rows[1]["critic/score/mean"].is_null());  // NaN is not JSON
  EXPECT_EQ(rows[2]["step"], 3);
}

TEST(Logger, JsonlHoldsEachStepOnceAcrossResumes) {
  testing::TempDir dir("jsonl_resume");
  {
    auto t = Tracking::create({"jsonl", "file"}, dir.path());  // both names: one file, written once
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->start_at(-1).ok());
    for (int step = 1; step <= 4; ++step) ASSERT_TRUE(t->log({{"a", 1.0 * step}}, step).ok());
  }
  ASSERT_EQ(read_lines(dir.path() / "metrics.jsonl").size(), 4u);
  {
    // Killed after step 4, resumed from the checkpoint of step 2: steps 3 and 4 run again.
    auto t = Tracking::create({"jsonl"}, dir.path());
    ASSERT_TRUE(t->start_at(2).ok());
    ASSERT_TRUE(t->log({{"val", 0.5}}, 2).ok());  // validation before training, at the resumed step
    ASSERT_TRUE(t->log({{"a", 30.0}}, 3).ok());
    ASSERT_TRUE(t->log({{"a", 40.0}}, 4).ok());
    ASSERT_TRUE(t->log({{"val", 0.75}}, 4).ok());  // validation of the last step merges too
  }
  auto rows = read_lines(dir.path() / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1], json({{"step", 2}, {"a", 2.0}, {"val", 0.5}}));
  EXPECT_EQ(rows[2], json({{"step", 3}, {"a", 30.0}}));
  EXPECT_EQ(rows[3], json({{"step", 4}, {"a", 40.0}, {"val", 0.75}}));
  {
    auto t = Tracking::create({"jsonl"}, dir.path());  // a fresh run in the same directory
    ASSERT_TRUE(t->start_at(-1).ok());
    ASSERT_TRUE(t->log({{"a", 9.0}}, 1).ok());
  }
  EXPECT_EQ(read_lines(dir.path() / "metrics.jsonl"), (std::vector<json>{json({{"step", 1}, {"a", 9.0}})}));
}

TEST(Logger, UnknownOrUnsupportedBackendIsAnError) {
  testing::TempDir dir("unknown");
  auto t = Tracking::create({"console", "wandb"}, dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "trainer.logger: 'wandb' is not supported by Tessera (supported: console, jsonl (or file), tensorboard)");
  auto typo = Tracking::create({"consol"}, dir.path());
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("unknown logger 'consol'"), std::string::npos);
  EXPECT_TRUE(check_logger_backends({"console", "file", "jsonl"}).ok());
  EXPECT_FALSE(check_logger_backends({"mlflow"}).ok());
}

// TensorBoard's own reader (PyPI's tensorboard EventAccumulator) reads the scalars back, and a
// resumed run's SessionLog START hides the steps the killed run logged past its checkpoint.
TEST(Logger, TensorBoardReadsTheEventFiles) {
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with tensorboard) is not set";
  testing::TempDir dir("tensorboard");
  const auto tb = dir.path() / "tb";
  {
    auto t = Tracking::create({"tensorboard"}, dir.path(), stdout, tb);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->start_at(-1).ok());
    for (int step = 1; step <= 4; ++step) {
      ASSERT_TRUE(t->log({{"critic/score/mean", 0.25 * step}, {"actor/kl", NAN}}, step).ok());
    }
  }
  {
    auto t = Tracking::create({"tensorboard"}, dir.path(), stdout, tb);  // resumed after step 2
    ASSERT_TRUE(t->start_at(2).ok());
    ASSERT_TRUE(t->log({{"critic/score/mean", 3.0}}, 3).ok());
  }
  std::ofstream(dir.path() / "read.py") << R"(
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
for e in acc.Scalars("critic/score/mean"):
    print(e.step, e.value)
print("tags", sorted(acc.Tags()["scalars"]))
)";
  const std::string out =
      testing::run_command(fmt::format("{} {} {} 2>&1", py, (dir.path() / "read.py").string(), tb.string())).text;
  // (TensorBoard's own log line about the purge may come first.)
  EXPECT_NE(out.find("\n1 0.25\n2 0.5\n3 3.0\ntags ['actor/kl', 'critic/score/mean']\n"), std::string::npos) << out;
}

TEST(Logger, ProgressBarClearsItsLineForConsoleLines) {
  std::FILE* sink = std::tmpfile();
  double now = 0;
  ProgressBar bar(4, sink, /*is_tty=*/true, [&] { return now; });
  bar.update(1);
  bar.clear();
  std::fputs("step:1 - a:1\n", sink);  // a console line, on a line of its own
  bar.clear();                         // nothing drawn: no-op
  bar.update(2);
  bar.finish();
  std::rewind(sink);
  std::string out;
  for (int c; (c = std::fgetc(sink)) != EOF;) out += static_cast<char>(c);
  std::fclose(sink);
  const size_t line = out.find("step:1 - a:1\n");
  ASSERT_NE(line, std::string::npos) << out;
  EXPECT_EQ(out.substr(line - 4, 4), "\r\033[K") << out;  // the bar's text was erased first
  EXPECT_EQ(out.find("\r\033[K", line + 1), line + 13);      // then redrawn
}

TEST(Logger, RunSummarySaysWhatRunsAndWhereItStarts) {
  RunSummary s;
  s.what = "GRPO";
  s.device = "cuda";
  s.groups = {{"actor_rollout_ref", 8}};
  s.train_rows = 7473;
  s.val_rows = 1319;
  s.steps_per_epoch = 29;
  s.epochs = 15;
  s.total_steps = 435;
  s.out_dir = "checkpoints/gsm8k/run1";
  s.save_freq = 20;
  auto lines = run_summary_lines(s);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "GRPO on cuda in this process: actor_rollout_ref (8 ranks)");
  EXPECT_EQ(lines[1], "data: 7473 training rows, 1319 validation rows; 29 steps per epoch x 15 epochs -> 435 steps");
  EXPECT_EQ(lines[2], "output: checkpoints/gsm8k/run1 (metrics.jsonl, config.yaml; checkpoints every 20 steps)");
  EXPECT_EQ(lines[3], "starting at step 1");
  s.resumed_step = 40;
  EXPECT_EQ(run_summary_lines(s)[3], "resuming after step 40 (checkpoint global_step_40); 395 steps to go");
  s.resumed_step = 435;
  EXPECT_EQ(run_summary_lines(s)[3], "nothing left to do: step 435 of 435 is done (checkpoint global_step_435)");
  s.agents = 2;
  s.val_rows = -1;
  EXPECT_EQ(run_summary_lines(s)[0], "GRPO on cuda across 2 agents: actor_rollout_ref (8 ranks)");
  EXPECT_NE(run_summary_lines(s)[1].find("no validation set"), std::string::npos);
}

TEST(Logger, ConsoleLineHasKeyMetrics) {
  ConsoleLogger console(stdout);
  Metrics m = {{"critic/score/mean", 0.5}, {"actor/pg_loss", -0.0123456}, {"val-core/a/acc/mean@1", 0.25},
               {"timing_s/gen", 3.0}, {"timing_s/step", 4.0}};
  std::string line = console.format_line(m, 7);
  EXPECT_EQ(line, "step:7 - critic/score/mean:0.5 - actor/pg_loss:-0.01235 - timing_s/step:4 - val-core/a/acc/mean@1:0.25");
  ConsoleLogger all(stdout, /*all_metrics=*/true);
  EXPECT_NE(all.format_line(m, 7).find("timing_s/gen:3"), std::string::npos);
}

TEST(Logger, ProgressBarRendersEta) {
  double now = 100.0;
  std::FILE* sink = std::tmpfile();
  ProgressBar bar(10, sink, /*is_tty=*/false, [&] { return now; });
  bar.set_initial(0);  // a fresh run whose first report is step 2
  now = 104.0;
  bar.update(2, {{"critic/score/mean", 0.5}});
  std::string line = bar.render(2, 4.0, {{"critic/score/mean", 0.5}});
  EXPECT_EQ(line, "[######........................] 2/10  20% 2.00s/step ETA 00:16 critic/score/mean=0.5");
  std::rewind(sink);
  char buf[256] = {};
  ASSERT_NE(std::fgets(buf, sizeof buf, sink), nullptr);
  EXPECT_EQ(std::string(buf), line + "\n");  // not a TTY: plain lines
  // Unset, the first update defines the starting point (a run resumed after step 4).
  ProgressBar resumed(10, sink, /*is_tty=*/false, [&] { return now; });
  now = 110.0;
  resumed.update(5);
  EXPECT_NE(resumed.render(5, 10.0, {}).find("10.00s/step ETA 00:50"), std::string::npos) << resumed.render(5, 10.0, {});
  std::fclose(sink);
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(NAN), "--:--");
}

}  // namespace
}  // namespace tessera::driver
