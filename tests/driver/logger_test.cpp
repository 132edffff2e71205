// Loggers: console line, jsonl rows (appended, one object per step), unknown names, progress bar.
#include <gtest/gtest.h>

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
    auto t = Tracking::create({"jsonl"}, dir.path() / "run");  // a resumed run appends
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.75}}, 3).ok());
  }
  auto rows = read_lines(dir.path() / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], json({{"step", 1}, {"critic/score/mean", 0.5}, {"timing_s/step", 1.25}}));
  EXPECT_TRUE(rows[1]["critic/score/mean"].is_null());  // NaN is not JSON
  EXPECT_EQ(rows[2]["step"], 3);
}

TEST(Logger, UnknownBackendIsAnError) {
  testing::TempDir dir("unknown");
  auto t = Tracking::create({"console", "wandb"}, dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'wandb'"), std::string::npos);
  EXPECT_NE(t.status().message().find("trainer.logger"), std::string::npos);
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
