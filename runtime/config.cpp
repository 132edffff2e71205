// config.cpp: RuntimeConfig::from_json, device lists, token files.
#include "runtime/config.hpp"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "proto/device.hpp"

namespace tessera::runtime {
namespace {

using Setter = std::function<Status(RuntimeConfig&, const nlohmann::json&)>;

// Reads `value` into `out` with a type check naming `key`.
template <class T>
Status read_as(const nlohmann::json& value, const std::string& key, T& out) {
  try {
    out = value.get<T>();
    return Status();
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::invalid_argument, "cluster.{}: {}", key, e.what());
  }
}

template <class T>
Setter field(T RuntimeConfig::*member, const std::string& key) {
  return [member, key](RuntimeConfig& c, const nlohmann::json& v) {
    return read_as(v, key, c.*member);
  };
}

Setter seconds(Millis RuntimeConfig::*member, const std::string& key) {
  return [member, key](RuntimeConfig& c, const nlohmann::json& v) {
    double s = 0;
    TESSERA_RETURN_IF_ERROR(read_as(v, key, s));
    if (!(s > 0)) return make_error(ErrorCode::invalid_argument, "cluster.{} must be > 0", key);
    c.*member = Millis(static_cast<int64_t>(s * 1000));
    return Status();
  };
}

Setter millis(Millis RuntimeConfig::*member, const std::string& key) {
  return [member, key](RuntimeConfig& c, const nlohmann::json& v) {
    int64_t ms = 0;
    TESSERA_RETURN_IF_ERROR(read_as(v, key, ms));
    if (ms < 0) return make_error(ErrorCode::invalid_argument, "cluster.{} must be >= 0", key);
    c.*member = Millis(ms);
    return Status();
  };
}

// A byte count: an integer >= 0.
Status read_bytes(const nlohmann::json& v, const std::string& key, uint64_t& out) {
  int64_t n = 0;
  TESSERA_RETURN_IF_ERROR(read_as(v, key, n));
  if (!v.is_number_integer() || n < 0) {
    return make_error(ErrorCode::invalid_argument, "cluster.{} must be an integer >= 0", key);
  }
  out = static_cast<uint64_t>(n);
  return Status();
}

Status read_data_plane(RuntimeConfig& c, const nlohmann::json& v) {
  if (!v.is_object()) return make_error(ErrorCode::invalid_argument, "cluster.data_plane: not a map");
  for (const auto& [key, item] : v.items()) {
    DataPlaneConfig& d = c.data_plane;
    std::string name = "data_plane." + key;
    if (key == "bind_host") TESSERA_RETURN_IF_ERROR(read_as(item, name, d.bind_host));
    else if (key == "port") TESSERA_RETURN_IF_ERROR(read_as(item, name, d.port));
    else if (key == "advertise_host") TESSERA_RETURN_IF_ERROR(read_as(item, name, d.advertise_host));
    else if (key == "shared_memory") TESSERA_RETURN_IF_ERROR(read_as(item, name, d.shared_memory));
    else if (key == "landing_idle_bytes") TESSERA_RETURN_IF_ERROR(read_bytes(item, name, d.landing_idle_bytes));
    else if (key == "peer_mapping_bytes") TESSERA_RETURN_IF_ERROR(read_bytes(item, name, d.peer_mapping_bytes));
    else return make_error(ErrorCode::invalid_argument, "unknown config key 'cluster.{}'", name);
  }
  return Status();
}

Status read_token_file_key(RuntimeConfig& c, const nlohmann::json& v) {
  std::string path;
  TESSERA_RETURN_IF_ERROR(read_as(v, "token_file", path));
  if (path.empty()) return Status();
  TESSERA_ASSIGN_OR_RETURN(c.token, read_token_file(path));
  return Status();
}

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"agents", field(&RuntimeConfig::agents, "agents")},
      {"token", field(&RuntimeConfig::token, "token")},
      {"token_file", read_token_file_key},
      {"embedded_devices", field(&RuntimeConfig::embedded_devices, "embedded_devices")},
      {"tls_cert", field(&RuntimeConfig::tls_cert, "tls_cert")},
      {"tls_key", field(&RuntimeConfig::tls_key, "tls_key")},
      {"tls_cafile", field(&RuntimeConfig::tls_cafile, "tls_cafile")},
      {"call_channel", field(&RuntimeConfig::call_channel, "call_channel")},
      {"scheduler_max_threads", field(&RuntimeConfig::scheduler_max_threads, "scheduler_max_threads")},
      {"inline_payload_max_bytes",
       field(&RuntimeConfig::inline_payload_max_bytes, "inline_payload_max_bytes")},
      {"call_timeout_s", seconds(&RuntimeConfig::call_timeout, "call_timeout_s")},
      {"connect_timeout_s", seconds(&RuntimeConfig::connect_timeout, "connect_timeout_s")},
      {"spawn_timeout_s", seconds(&RuntimeConfig::spawn_timeout, "spawn_timeout_s")},
      {"shutdown_timeout_s", seconds(&RuntimeConfig::shutdown_timeout, "shutdown_timeout_s")},
      {"heartbeat_interval_ms", millis(&RuntimeConfig::heartbeat_interval, "heartbeat_interval_ms")},
      {"connection_timeout_ms", millis(&RuntimeConfig::connection_timeout, "connection_timeout_ms")},
      {"idle_poll_us", [](RuntimeConfig& c, const nlohmann::json& v) {
         int64_t us = 0;
         TESSERA_RETURN_IF_ERROR(read_as(v, "idle_poll_us", us));
         if (us < 0 || us > 1000000) {
           return make_error(ErrorCode::invalid_argument, "cluster.idle_poll_us must be in [0, 1000000]");
         }
         c.idle_poll = std::chrono::microseconds(us);
         return Status();
       }},
      {"data_plane", read_data_plane},
  };
  return table;
}

// Parses a non-negative decimal integer; error names `text`.
Result<int> parse_int(const std::string& text, const std::string& spec) {
  if (text.empty() || text.size() > 6) {
    return make_error(ErrorCode::invalid_argument, "bad device spec '{}': '{}' is not a number",
                      spec, text);
  }
  int n = 0;
  for (char ch : text) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) {
      return make_error(ErrorCode::invalid_argument, "bad device spec '{}': '{}' is not a number",
                        spec, text);
    }
    n = n * 10 + (ch - '0');
  }
  return n;
}

// One comma-separated item: "cpu:N" (N devices) or "cuda:A" / "cuda:A-B" (ordinals).
Status expand_item(const std::string& item, const std::string& spec, int& next_cpu,
                   std::vector<std::string>& out) {
  auto colon = item.find(':');
  std::string kind = item.substr(0, colon);
  std::string rest = colon == std::string::npos ? "" : item.substr(colon + 1);
  if (kind == "cpu") {
    TESSERA_ASSIGN_OR_RETURN(int n, parse_int(rest, spec));
    if (n < 1) return make_error(ErrorCode::invalid_argument, "bad device spec '{}': cpu:N needs a device count N >= 1",
                                 spec);
    for (int i = 0; i < n; ++i) out.push_back("cpu:" + std::to_string(next_cpu++));
    return Status();
  }
  if (kind == "cuda") {
    auto dash = rest.find('-');
    TESSERA_ASSIGN_OR_RETURN(int lo, parse_int(rest.substr(0, dash), spec));
    int hi = lo;
    if (dash != std::string::npos) {
      TESSERA_ASSIGN_OR_RETURN(hi, parse_int(rest.substr(dash + 1), spec));
    }
    if (hi < lo) return make_error(ErrorCode::invalid_argument, "bad device spec '{}'", spec);
    for (int i = lo; i <= hi; ++i) out.push_back("cuda:" + std::to_string(i));
    return Status();
  }
  return make_error(ErrorCode::invalid_argument,
                    "bad device spec '{}': item '{}' is not cpu:N or cuda:A[-B]", spec, item);
}

}  // namespace

Result<RuntimeConfig> RuntimeConfig::from_json(const nlohmann::json& cluster) {
  RuntimeConfig config;
  if (cluster.is_null()) return config;
  if (!cluster.is_object()) return make_error(ErrorCode::invalid_argument, "cluster: not a map");
  for (const auto& [key, value] : cluster.items()) {
    auto it = setters().find(key);
    if (it == setters().end()) {
      return make_error(ErrorCode::invalid_argument, "unknown config key 'cluster.{}'", key);
    }
    TESSERA_RETURN_IF_ERROR(it->second(config, value));
  }
  if (!config.agents.empty() && config.token.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "cluster.agents is set but neither cluster.token nor cluster.token_file is");
  }
  return config;
}

Result<std::vector<std::string>> parse_devices(const std::string& spec) {
  std::vector<std::string> out;
  int next_cpu = 0;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    TESSERA_RETURN_IF_ERROR(expand_item(item, spec, next_cpu, out));
  }
  if (out.empty()) return make_error(ErrorCode::invalid_argument, "empty device spec '{}'", spec);
  return out;
}

Result<std::string> read_token_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return make_error(ErrorCode::not_found, "token file '{}' cannot be read", path);
  }
  if ((st.st_mode & 077) != 0) {
    return make_error(ErrorCode::permission_denied,
                      "token file '{}' is accessible by group/others (mode {:o}); chmod 600 it",
                      path, st.st_mode & 0777);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::io_error, "token file '{}' cannot be opened", path);
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.size() < 16) {
    return make_error(ErrorCode::invalid_argument,
                      "token file '{}' holds {} bytes; at least 16 are required", path,
                      token.size());
  }
  return token;
}

}  // namespace tessera::runtime

namespace tessera::runtime {

Status check_devices_supported(const std::vector<std::string>& devices) {
  for (const auto& d : devices) {
    TESSERA_ASSIGN_OR_RETURN(c10::Device device, proto::parse_device(d));
    TESSERA_RETURN_IF_ERROR(proto::require_device(device));
  }
  return Status();
}

}  // namespace tessera::runtime
