// leader_relay.cpp: see leader_relay.hpp.
#include "workers/rollout/internal/leader_relay.hpp"

#include <cstring>

#include <ATen/ATen.h>

#include "runtime/collective/exchange.hpp"

namespace tessera::rollout::internal {

Status send_or_receive(collective::Communicator& group, nlohmann::ordered_json& message, std::chrono::milliseconds timeout,
                       const std::string& what) {
  std::string text = group.rank() == 0
                         ? message.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                         : std::string();
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  if (!text.empty()) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  auto all = collective::all_gather_bytes(group, bytes, collective::CollectiveOptions{timeout});
  if (!all.ok()) return all.status().with_context("rollout TP: " + what + " of TP rank 0");
  if (group.rank() == 0) return Status();
  const at::Tensor& from = (*all)[0];
  message = nlohmann::ordered_json::parse(std::string(reinterpret_cast<const char*>(from.data_ptr<uint8_t>()),
                                                      static_cast<size_t>(from.numel())),
                                          nullptr, false);
  if (message.is_discarded()) return Status(ErrorCode::internal, "rollout TP: TP rank 0 sent unreadable " + what);
  return Status();
}

nlohmann::ordered_json error_message(const Status& st) {
  return {{"status", static_cast<int>(st.code())}, {"message", st.message()}};
}

Status error_of(const nlohmann::ordered_json& message) {
  if (!message.is_object() || !message.contains("status")) return Status();
  return Status(static_cast<ErrorCode>(message["status"].get<int>()), message["message"].get<std::string>());
}

}  // namespace tessera::rollout::internal
