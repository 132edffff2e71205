// messages.hpp: every message type and atom the runtime sends through CAF, and their type-ID
// block (`caf::id_block::tessera`), registered on every node by make_actor_system_config().
//
// Control messages only: tensors never travel here. A DataProto crosses actors as a
// PayloadHandle (owner, id, key, size, rows) that the receiver pulls over the data plane, or,
// when it is small (RuntimeConfig::inline_payload_max_bytes) and the receiver is remote, as an
// encoded frame inline (one CAF round trip instead of three).
//
// All fields are plain values with free inspect() functions; enums travel as uint8_t.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include "proto/fwd.hpp"

namespace tessera::runtime {

/// Where a payload lives and how to ask for it. Holding one is the right to fetch it (the key is
/// a random capability), so handles only travel over authenticated CAF connections.
struct PayloadHandle {
  std::string host;     ///< Owner's data-plane address (IP or host name).
  uint16_t port = 0;    ///< Owner's data-plane TCP port.
  std::string host_id;  ///< Identity of the owner's machine; equal ids may use shared memory.
  uint64_t owner = 0;   ///< Random id of the owner's DataPlane instance.
  uint64_t id = 0;      ///< Payload id within the owner.
  uint64_t key = 0;     ///< Random capability key a fetch must present.
  uint64_t bytes = 0;   ///< Tensor bytes of the whole payload (the wire size, roughly).
  int64_t rows = 0;     ///< Row count (DataProto::size()).
};

/// Rows [row_begin, row_end) of one payload.
struct PayloadSlice {
  PayloadHandle handle;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

/// WireValue::kind values.
enum class WireKind : uint8_t {
  json = 0,          ///< `json` holds JSON text.
  proto_inline = 1,  ///< `frame` holds one encoded DataProto (proto/codec.hpp).
  proto_slices = 2,  ///< `slices` are fetched and concatenated in order into one DataProto.
  list = 3,          ///< `items` is a list of values.
  /// `local` points at the DataProto itself: sender and receiver share this process (Note
  /// [In-process values] in runtime/wire.hpp). With local_end >= 0, the value is rows
  /// [local_begin, local_end) of *local, cut by the receiver (Note [Chunks cut by the receiver]).
  /// Never serialised: arriving from another process, it is refused as corrupt.
  proto_local = 4,
};

/// A method argument or result as it crosses actors (runtime::Value's wire form).
struct WireValue {
  uint8_t kind = static_cast<uint8_t>(WireKind::json);
  std::string json = "null";
  std::vector<char> frame;
  std::vector<PayloadSlice> slices;
  std::vector<WireValue> items;
  std::shared_ptr<const proto::DataProto> local;  ///< proto_local only; not serialised.
  /// proto_local only, not serialised: the receiver takes rows [local_begin, local_end) of
  /// *local (Note [Chunks cut by the receiver], runtime/wire.hpp); local_end < 0: all of it.
  int64_t local_begin = 0;
  int64_t local_end = -1;
};

/// What a worker knows about its place in its group (verl's WORLD_SIZE, RANK, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT). Assigned by the runtime at spawn.
struct WorkerContext {
  std::string group;           ///< Worker group name (verl's WG_PREFIX).
  int32_t rank = 0;            ///< Rank in the group.
  int32_t world_size = 1;      ///< Ranks in the group.
  int32_t local_rank = 0;      ///< Rank among the group's ranks on this node.
  int32_t local_world_size = 1;///< The group's ranks on this node.
  std::string device;          ///< "cpu:N" or "cuda:I".
  std::string host;            ///< Host name of the node running the worker.
  std::string master_addr;     ///< Rendezvous host (rank 0's node).
  uint16_t master_port = 0;    ///< Rendezvous port, free on master_addr when assigned.
};

/// One role of a worker actor: a registered worker type and its init config (JSON text).
struct RoleSpec {
  std::string role;        ///< "" for a single-role actor; else methods are "{role}_{method}".
  std::string type_name;   ///< Name in the WorkerTypeRegistry.
  std::string init_config = "{}";
};

/// Asks an agent for one worker actor hosting `roles` on `context.device`.
struct SpawnRequest {
  WorkerContext context;
  std::vector<RoleSpec> roles;
};

/// CallRequest::result_mode values: how long the callee keeps a DataProto result.
enum class ResultMode : uint8_t {
  fetch_once = 0,  ///< The caller fetches it once (blocking calls); inlined when small and remote.
  keep = 1,        ///< Kept until released (futures: consumers fetch slices peer to peer).
};

/// One method call on one worker actor.
struct CallRequest {
  std::string method;
  std::vector<WireValue> args;
  uint8_t result_mode = static_cast<uint8_t>(ResultMode::fetch_once);
};

/// The value a method returned.
struct CallReply {
  WireValue result;
};

/// A registered method and its attributes (JSON text, e.g. dispatch/execute mode).
struct MethodInfo {
  std::string name;
  std::string attributes = "{}";
};

/// What an agent advertises after authentication.
struct AgentInfo {
  std::string host;                  ///< Host name (or listen address) of the node.
  std::string host_id;               ///< Machine identity (boot id + host name).
  std::vector<std::string> devices;  ///< "cpu:0", ..., or "cuda:0", ...
  int64_t pid = 0;                   ///< Agent process id.
  std::string version;               ///< Tessera version string.
  /// Note [Call channel] in runtime/internal/call_channel.hpp, answered to auth_atom only:
  /// the agent's call-channel port (0: none offered, e.g. with TLS) and this driver's
  /// session id and key there.
  uint16_t call_port = 0;
  uint64_t call_session = 0;
  std::string call_key;
};

/// Several calls to workers hosted by one agent, sent as ONE message (the agent fans out
/// locally and answers once: one BASP round trip per agent instead of one per rank).
/// Sent as (call_atom, uint64_t call_id, AgentCall); answered with (reply_atom, call_id,
/// AgentCallReply) as a plain message (Note [Late replies] in runtime/call_hub.hpp).
struct AgentCall {
  std::vector<caf::actor> workers;   ///< Workers of the receiving agent.
  std::vector<CallRequest> requests; ///< requests[i] goes to workers[i].
};

/// The answers to an AgentCall, in order: codes[i] == 0 means results[i] holds the value,
/// otherwise codes[i] is an ErrorCode and messages[i] the error text.
struct AgentCallReply {
  std::vector<uint8_t> codes;
  std::vector<std::string> messages;
  std::vector<WireValue> results;
};

/// Sent by an agent to the driver that spawned a worker when that worker terminates.
struct WorkerDown {
  std::string group;
  int32_t rank = 0;
  std::string host;
  std::string reason;
};

// ---- inspect() ---------------------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PayloadHandle& x) {
  return f(caf::meta::type_name("PayloadHandle"), x.host, x.port, x.host_id, x.owner, x.id,
           x.key, x.bytes, x.rows);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PayloadSlice& x) {
  return f(caf::meta::type_name("PayloadSlice"), x.handle, x.row_begin, x.row_end);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WireValue& x) {
  return f(caf::meta::type_name("WireValue"), x.kind, x.json, x.frame, x.slices, x.items);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerContext& x) {
  return f(caf::meta::type_name("WorkerContext"), x.group, x.rank, x.world_size, x.local_rank,
           x.local_world_size, x.device, x.host, x.master_addr, x.master_port);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RoleSpec& x) {
  return f(caf::meta::type_name("RoleSpec"), x.role, x.type_name, x.init_config);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SpawnRequest& x) {
  return f(caf::meta::type_name("SpawnRequest"), x.context, x.roles);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CallRequest& x) {
  return f(caf::meta::type_name("CallRequest"), x.method, x.args, x.result_mode);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CallReply& x) {
  return f(caf::meta::type_name("CallReply"), x.result);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MethodInfo& x) {
  return f(caf::meta::type_name("MethodInfo"), x.name, x.attributes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AgentInfo& x) {
  return f(caf::meta::type_name("AgentInfo"), x.host, x.host_id, x.devices, x.pid, x.version,
           x.call_port, x.call_session, x.call_key);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AgentCall& x) {
  return f(caf::meta::type_name("AgentCall"), x.workers, x.requests);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AgentCallReply& x) {
  return f(caf::meta::type_name("AgentCallReply"), x.codes, x.messages, x.results);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerDown& x) {
  return f(caf::meta::type_name("WorkerDown"), x.group, x.rank, x.host, x.reason);
}

// ---- atoms (at most 10 characters) -------------------------------------------------------------

using call_atom = caf::atom_constant<caf::atom("ts_call")>;        ///< (call, CallRequest)
using methods_atom = caf::atom_constant<caf::atom("ts_methods")>;  ///< -> vector<MethodInfo>
using init_atom = caf::atom_constant<caf::atom("ts_init")>;        ///< worker: build roles
using hello_atom = caf::atom_constant<caf::atom("ts_hello")>;      ///< auth step 1
using auth_atom = caf::atom_constant<caf::atom("ts_auth")>;        ///< auth step 2
using info_atom = caf::atom_constant<caf::atom("ts_info")>;        ///< -> AgentInfo
using rdzv_atom = caf::atom_constant<caf::atom("ts_rdzv")>;        ///< -> free port (uint16)
using down_atom = caf::atom_constant<caf::atom("ts_down")>;        ///< (down, WorkerDown)
using watch_atom = caf::atom_constant<caf::atom("ts_watch")>;      ///< call hub: monitor
using batch_atom = caf::atom_constant<caf::atom("ts_batch")>;      ///< call hub: call many
using context_atom = caf::atom_constant<caf::atom("ts_ctx")>;      ///< -> WorkerContext
using reply_atom = caf::atom_constant<caf::atom("ts_reply")>;      ///< (reply, id, AgentCallReply)
using release_atom = caf::atom_constant<caf::atom("ts_release")>; ///< agent: drop payloads

}  // namespace tessera::runtime

CAF_BEGIN_TYPE_ID_BLOCK(tessera, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::PayloadHandle))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::PayloadSlice))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::WireValue))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::WorkerContext))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::RoleSpec))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::SpawnRequest))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::CallRequest))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::CallReply))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::MethodInfo))
CAF_ADD_TYPE_ID(tessera, (std::vector<tessera::runtime::MethodInfo>))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::AgentInfo))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::AgentCall))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::AgentCallReply))
CAF_ADD_TYPE_ID(tessera, (tessera::runtime::WorkerDown))
CAF_ADD_TYPE_ID(tessera, (std::vector<tessera::runtime::PayloadHandle>))
CAF_END_TYPE_ID_BLOCK(tessera)
