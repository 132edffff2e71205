// leader_relay.hpp: rollout TP's leader relays (private). The peers of a TP group run the same
// conversations; the Python processes beside them (the tool host, the agent loops) run once, on
// the group's rank 0, which sends what they answered to its peers.
//
// Thread-safety: none; collective over the group.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::rollout::internal {

/// Rank 0 sends `message` to every peer of `group` (collective): on the peers it is replaced by
/// rank 0's. `what` names the payload in errors ("the tool answers"). The peers wait up to `timeout`.
Status send_or_receive(collective::Communicator& group, nlohmann::ordered_json& message, std::chrono::milliseconds timeout,
                       const std::string& what);

/// A status as a relayed message, and back: error_of is OK for any message that is not one.
nlohmann::ordered_json error_message(const Status& st);
Status error_of(const nlohmann::ordered_json& message);

}  // namespace tessera::rollout::internal
