#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "proto/device.hpp"
#include "runtime/config.hpp"

namespace tessera::runtime {
namespace {

std::string temp_file(const std::string& name, const std::string& text, mode_t mode) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(Config, DevicesExpand) {
  EXPECT_EQ(*parse_devices("cpu:3"), (std::vector<std::string>{"cpu:0", "cpu:1", "cpu:2"}));
  EXPECT_EQ(*parse_devices("cuda:0-2"), (std::vector<std::string>{"cuda:0", "cuda:1", "cuda:2"}));
  EXPECT_EQ(*parse_devices("cuda:5"), (std::vector<std::string>{"cuda:5"}));
  EXPECT_EQ(*parse_devices("cpu:1,cuda:2"), (std::vector<std::string>{"cpu:0", "cuda:2"}));
  for (const char* bad : {"", "cpu", "cpu:x", "gpu:1", "cuda:3-1", "cpu:0"}) {
    Result<std::vector<std::string>> r = parse_devices(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_NE(r.status().message().find(bad), std::string::npos) << bad;
  }
}

TEST(Config, CudaDevicesMustExistInThisProcess) {
  // A cuda device this process cannot reach (no CUDA build, no GPU, or too few) is refused up
  // front with one line naming it: nothing falls back to the CPU.
  const std::string beyond = "cuda:" + std::to_string(proto::cuda_device_count());
  Status st = check_devices_supported({"cpu:0", beyond});
  EXPECT_EQ(st.code(), ErrorCode::unavailable) << st.to_string();
  EXPECT_NE(st.message().find(beyond), std::string::npos) << st.to_string();
  EXPECT_TRUE(check_devices_supported({"cpu:0"}).ok());
  EXPECT_EQ(check_devices_supported({"tpu:0"}).code(), ErrorCode::invalid_argument);
  if (proto::cuda_device_count() > 0) EXPECT_TRUE(check_devices_supported({"cuda:0"}).ok());
}

TEST(Config, TokenFileMustBePrivate) {
  std::string ok = temp_file("tok_ok", "0123456789abcdef0123\n", 0600);
  EXPECT_EQ(*read_token_file(ok), "0123456789abcdef0123");
  std::string open = temp_file("tok_open", "0123456789abcdef0123\n", 0644);
  Result<std::string> r = read_token_file(open);
  EXPECT_EQ(r.status().code(), ErrorCode::permission_denied);
  EXPECT_NE(r.status().message().find("chmod 600"), std::string::npos);
  std::string group = temp_file("tok_group", "0123456789abcdef0123\n", 0640);
  EXPECT_EQ(read_token_file(group).status().code(), ErrorCode::permission_denied);
  std::string shorty = temp_file("tok_short", "abc\n", 0600);
  EXPECT_EQ(read_token_file(shorty).status().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(read_token_file("/nonexistent/tok").status().code(), ErrorCode::not_found);
}

TEST(Config, FromJsonReadsKeysAndRejectsUnknownOnes) {
  auto cfg = RuntimeConfig::from_json(nlohmann::json{
      {"agents", {"10.0.0.1:7700", "10.0.0.2:7700"}},
      {"token", "0123456789abcdef"},
      {"call_timeout_s", 2.5},
      {"heartbeat_interval_ms", 100},
      {"idle_poll_us", 50},
      {"call_channel", false},
      {"data_plane", {{"bind_host", "0.0.0.0"}, {"port", 9000}, {"landing_idle_bytes", 1 << 20},
                      {"peer_mapping_bytes", 0}}}});
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->data_plane.landing_idle_bytes, uint64_t{1} << 20);
  EXPECT_EQ(cfg->data_plane.peer_mapping_bytes, 0u);
  EXPECT_EQ(cfg->agents.size(), 2u);
  EXPECT_EQ(cfg->call_timeout, Millis(2500));
  EXPECT_EQ(cfg->heartbeat_interval, Millis(100));
  EXPECT_EQ(cfg->idle_poll, std::chrono::microseconds(50));
  EXPECT_FALSE(cfg->call_channel);
  EXPECT_TRUE(RuntimeConfig().call_channel);  // on unless configured off
  auto not_bool = RuntimeConfig::from_json(nlohmann::json{{"call_channel", "yes"}});
  EXPECT_NE(not_bool.status().message().find("cluster.call_channel"), std::string::npos)
      << not_bool.status().message();
  for (int bad_poll : {-1, 2000000}) {
    auto poll = RuntimeConfig::from_json(nlohmann::json{{"idle_poll_us", bad_poll}});
    EXPECT_NE(poll.status().message().find("cluster.idle_poll_us"), std::string::npos)
        << poll.status().message();
  }
  EXPECT_EQ(cfg->data_plane.port, 9000);
  auto bad = RuntimeConfig::from_json(nlohmann::json{{"agentz", {}}});
  EXPECT_NE(bad.status().message().find("cluster.agentz"), std::string::npos);
  auto bad2 = RuntimeConfig::from_json(nlohmann::json{{"data_plane", {{"prot", 1}}}});
  EXPECT_NE(bad2.status().message().find("cluster.data_plane.prot"), std::string::npos);
  auto bad3 = RuntimeConfig::from_json(nlohmann::json{{"data_plane", {{"landing_idle_bytes", -1}}}});
  EXPECT_NE(bad3.status().message().find("cluster.data_plane.landing_idle_bytes"),
            std::string::npos) << bad3.status().message();
  auto no_token = RuntimeConfig::from_json(nlohmann::json{{"agents", {"h:1"}}});
  EXPECT_EQ(no_token.status().code(), ErrorCode::invalid_argument);
  auto neg = RuntimeConfig::from_json(nlohmann::json{{"call_timeout_s", 0}});
  EXPECT_FALSE(neg.ok());
}

}  // namespace
}  // namespace tessera::runtime
