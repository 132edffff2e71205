// The worker actor shell and the call protocol, on CAF's deterministic test scheduler: every
// message is delivered by sched().run(), timeouts fire on trigger_timeouts(); nothing sleeps.
#include <gtest/gtest.h>

#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <torch/torch.h>

#include "runtime/actor_system.hpp"
#include "runtime/agent.hpp"
#include "runtime/call_hub.hpp"
#include "runtime/errors.hpp"
#include "runtime/wire.hpp"
#include "runtime/worker_actor.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

using testing::test_registry;

class WorkerActorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sys = ActorSystem::start(cfg_, ActorSystemOptions{false, true});
    ASSERT_TRUE(sys.ok()) << sys.status().to_string();
    sys_ = std::move(sys).value();
    auto dp = DataPlane::start(cfg_.data_plane);
    ASSERT_TRUE(dp.ok()) << dp.status().to_string();
    dp_ = std::move(dp).value();
    AgentEnv env;
    env.registry = &test_registry();
    env.data_plane = dp_.get();
    env.devices = {"cpu:0", "cpu:1", "cpu:2"};
    env.host = "test-host";
    env.trust_local_only = true;
    env.detached_workers = false;  // the test scheduler runs them
    agent_ = spawn_agent_actor(sys_->system(), env);
    sys_->track(agent_);
    hub_ = std::make_unique<CallHub>(sys_->system(), Millis(10000));
  }
  void TearDown() override {
    hub_.reset();
    sys_->shutdown();
  }

  caf::scheduler::test_coordinator& sched() {
    return dynamic_cast<caf::scheduler::test_coordinator&>(sys_->system().scheduler());
  }

  // Spawns through the agent (the production path); the error if spawning fails.
  Result<WorkerRef> spawn(int32_t rank, std::vector<RoleSpec> roles) {
    WorkerContext ctx{"g", rank, 3, rank, 3, "cpu:" + std::to_string(rank), "test-host",
                      "127.0.0.1", 29500};
    caf::scoped_actor self{sys_->system()};
    auto handle = self->request(agent_, caf::infinite, caf::spawn_atom::value,
                                SpawnRequest{ctx, std::move(roles)});
    sched().run();
    Result<WorkerRef> out = Status(ErrorCode::internal, "no reply");
    handle.receive([&](caf::actor& a) { out = WorkerRef{a, ctx, true, {}, nullptr}; },
                   [&](caf::error& e) { out = to_status(e); });
    return out;
  }

  Result<WireValue> call_one(const WorkerRef& w, const std::string& method,
                             std::vector<Value> args = {}) {
    CallRequest req;
    req.method = method;
    for (const Value& a : args) req.args.push_back(*to_wire(a, *dp_, EncodeOptions{}));
    auto batch = hub_->call({w}, {req});
    sched().run();
    EXPECT_TRUE(batch->ready());
    return batch->wait()[0];
  }

  RuntimeConfig cfg_;
  std::unique_ptr<ActorSystem> sys_;
  std::unique_ptr<DataPlane> dp_;
  caf::actor agent_;
  std::unique_ptr<CallHub> hub_;
};

proto::DataProto make_batch(int64_t rows) {
  return *proto::DataProto::from_dict(
      {{"x", torch::arange(rows * 2, torch::kFloat32).view({rows, 2})}});
}

TEST_F(WorkerActorTest, InvokesARegisteredMethodWithDataProtoArgs) {
  auto w = spawn(1, {{"", "echo", "{}"}});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  proto::DataProto in = make_batch(4);
  auto out = call_one(*w, "double_it", {Value(in)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  auto v = from_wire(*out, *dp_, true);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(torch::equal(*v->proto().tensor("x"), *in.tensor("x") * 2));
  EXPECT_EQ(v->proto().meta_info()["rank"], 1);
  EXPECT_EQ(dp_->stats().payloads, 0u);  // input and result were each consumed once
}

TEST_F(WorkerActorTest, InProcessPayloadsAreNotCopied) {
  auto w = spawn(0, {{"", "echo", "{}"}});
  ASSERT_TRUE(w.ok());
  proto::DataProto in = make_batch(3);
  auto v = from_wire(*call_one(*w, "identity", {Value(in)}), *dp_, true);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->proto().tensor("x")->data_ptr(), in.tensor("x")->data_ptr());
  EXPECT_EQ(dp_->stats().served_tcp_bytes + dp_->stats().served_shm_bytes, 0u);
}

TEST_F(WorkerActorTest, WorkerKnowsItsPlace) {
  auto w = spawn(2, {{"", "echo", "{}"}});
  ASSERT_TRUE(w.ok());
  auto v = from_wire(*call_one(*w, "rank_info"), *dp_, true);
  const nlohmann::json& j = v->json();
  EXPECT_EQ(j["rank"], 2);
  EXPECT_EQ(j["world_size"], 3);
  EXPECT_EQ(j["local_rank"], 2);
  EXPECT_EQ(j["device"], "cpu:2");
  EXPECT_EQ(j["master_addr"], "127.0.0.1");
  EXPECT_EQ(j["master_port"], 29500);
}

TEST_F(WorkerActorTest, ExceptionsBecomeErrorsNamingRankAndMethodAndTheActorLivesOn) {
  auto w = spawn(1, {{"", "echo", "{}"}});
  ASSERT_TRUE(w.ok());
  auto r = call_one(*w, "fail");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::internal);
  std::string m = r.status().message();
  EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
  EXPECT_NE(m.find("'fail'"), std::string::npos) << m;
  EXPECT_NE(m.find("boom"), std::string::npos) << m;
  auto t = call_one(*w, "torch_fail");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("is invalid for input of size 2"), std::string::npos)
      << t.status().message();
  EXPECT_EQ(t.status().message().find('\n'), std::string::npos);  // one line
  auto ok = call_one(*w, "add", {Value(nlohmann::json(2)), Value(nlohmann::json(3))});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(from_wire(*ok, *dp_, true)->json(), 5.0);
  auto missing = call_one(*w, "nope");
  EXPECT_EQ(missing.status().code(), ErrorCode::not_found);
}

TEST_F(WorkerActorTest, ColocatedRolesArePrefixed) {
  auto w = spawn(0, {{"actor", "echo", "{}"}, {"critic", "critic", "{}"}});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto a = call_one(*w, "actor_double_it", {Value(make_batch(2))});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto c = from_wire(*call_one(*w, "critic_value", {Value(make_batch(5))}), *dp_, true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->json()["rows"], 5);
  EXPECT_EQ(call_one(*w, "double_it").status().code(), ErrorCode::not_found);
  (void)from_wire(*a, *dp_, true);
}

TEST_F(WorkerActorTest, ConstructionFailuresAreReportedBySpawn) {
  auto bad_type = spawn(0, {{"", "no_such_type", "{}"}});
  EXPECT_EQ(bad_type.status().code(), ErrorCode::not_found);
  EXPECT_NE(bad_type.status().message().find("echo"), std::string::npos);  // lists known types
  auto fails = spawn(0, {{"", "echo", R"({"fail": true})"}});
  EXPECT_EQ(fails.status().code(), ErrorCode::invalid_argument);
  auto throws = spawn(0, {{"", "echo", R"({"throw": true})"}});
  EXPECT_EQ(throws.status().code(), ErrorCode::internal);
  EXPECT_NE(throws.status().message().find("on purpose"), std::string::npos);
  auto bad_device = spawn(7, {{"", "echo", "{}"}});
  EXPECT_EQ(bad_device.status().code(), ErrorCode::invalid_argument);
}

// An agent that accepts AgentCalls and never answers (its workers are stuck in a long call).
caf::behavior silent_agent(caf::event_based_actor*) {
  return {[=](call_atom, uint64_t, const AgentCall&) {}};
}

TEST_F(WorkerActorTest, ADeadAgentFailsAllItsPendingCallsAtOnce) {
  caf::actor hole = sys_->system().spawn(silent_agent);
  hub_->watch_agent(hole, "node-b:7700");
  WorkerContext ctx{"actor", 3, 4, 1, 2, "cpu:1", "node-b", "", 0};
  WorkerRef ref{hole, ctx, false, hole, nullptr};
  hub_->watch_worker(ref);
  CallRequest req;
  req.method = "update_actor";
  auto b1 = hub_->call({ref}, {req});
  auto b2 = hub_->call({ref}, {req});
  sched().run();
  EXPECT_FALSE(b1->ready());
  caf::anon_send_exit(hole, caf::exit_reason::kill);
  sched().run();
  ASSERT_TRUE(b1->ready());
  ASSERT_TRUE(b2->ready());
  Status st = b1->wait()[0].status();
  EXPECT_EQ(st.code(), ErrorCode::unavailable);
  for (const char* part : {"rank 3", "node-b", "'actor'", "'update_actor'", "died"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.message();
  }
  EXPECT_EQ(b2->wait()[0].status().code(), ErrorCode::unavailable);
  auto b3 = hub_->call({ref}, {req});  // later calls fail at once
  ASSERT_TRUE(b3->ready());
  EXPECT_NE(b3->wait()[0].status().message().find("is dead"), std::string::npos);
}

TEST_F(WorkerActorTest, EveryRemoteRequestHasAFiniteTimeout) {
  caf::actor hole = sys_->system().spawn(silent_agent);
  hub_->watch_agent(hole, "node-a:7700");
  WorkerRef ref{hole, WorkerContext{"g", 0, 1, 0, 1, "cpu:0", "node-a", "", 0}, false, hole, nullptr};
  CallRequest req;
  req.method = "generate_sequences";
  auto batch = hub_->call({ref}, {req}, Millis(50));
  sched().run();
  EXPECT_FALSE(batch->ready());
  sched().trigger_timeouts();
  sched().run();
  ASSERT_TRUE(batch->ready());
  Status st = batch->wait()[0].status();
  EXPECT_EQ(st.code(), ErrorCode::timeout);
  EXPECT_NE(st.message().find("'generate_sequences'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  caf::anon_send_exit(hole, caf::exit_reason::kill);
  sched().run();
}

TEST_F(WorkerActorTest, ALocalWorkerThatDiedFailsTheCallInsteadOfHanging) {
  auto w = spawn(1, {{"", "echo", "{}"}});
  ASSERT_TRUE(w.ok());
  caf::anon_send_exit(w->actor, caf::exit_reason::kill);
  sched().run();
  auto r = call_one(*w, "rank_info");
  EXPECT_EQ(r.status().code(), ErrorCode::unavailable);
  EXPECT_NE(r.status().message().find("terminated before answering"), std::string::npos)
      << r.status().message();
}

TEST_F(WorkerActorTest, AnAgentFansOutOneMessageToItsWorkers) {
  hub_->watch_agent(agent_, "test-agent");
  std::vector<WorkerRef> refs;
  for (int r = 0; r < 3; ++r) {
    WorkerRef ref = *spawn(r, {{"", "echo", "{}"}});
    ref.local = false;  // go through the agent, as for a remote node
    ref.agent = agent_;
    refs.push_back(ref);
  }
  std::vector<CallRequest> reqs(3);
  for (auto& q : reqs) q.method = "rank_info";
  reqs[2].method = "fail";
  auto batch = hub_->call(refs, reqs);
  sched().run();
  ASSERT_TRUE(batch->ready());
  auto results = batch->wait();
  EXPECT_EQ(from_wire(*results[1], *dp_, true)->json()["rank"], 1);
  EXPECT_NE(results[2].status().message().find("boom"), std::string::npos);
}

TEST_F(WorkerActorTest, AWorkerDyingDuringAFanOutFailsItsOwnTargetAndEndsTheCall) {
  hub_->watch_agent(agent_, "test-agent");
  std::vector<WorkerRef> refs;
  for (int r = 0; r < 2; ++r) {
    WorkerRef ref = *spawn(r, {{"", "echo", "{}"}});
    ref.local = false;
    ref.agent = agent_;
    refs.push_back(ref);
  }
  std::vector<CallRequest> reqs(2);
  for (auto& q : reqs) q.method = "rank_info";
  auto batch = hub_->call(refs, reqs);
  caf::anon_send_exit(refs[1].actor, caf::exit_reason::kill);  // dies with the call on its way
  sched().run();
  ASSERT_TRUE(batch->ready());
  auto results = batch->wait();
  // Rank 0 answered before rank 1's death was known, or was given up naming it (Note [Failing
  // fast]); never a second failure of its own.
  if (results[0].ok()) {
    EXPECT_EQ(from_wire(*results[0], *dp_, true)->json()["rank"], 0);
  } else {
    EXPECT_EQ(results[0].status().code(), ErrorCode::cancelled);
    EXPECT_NE(results[0].status().message().find("rank 1"), std::string::npos);
  }
  Status st = results[1].status();
  EXPECT_EQ(st.code(), ErrorCode::unavailable) << st.to_string();
  for (const char* part : {"rank 1", "test-host", "'rank_info'"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.message();
  }
}

TEST_F(WorkerActorTest, AnAgentCallsOnlyWorkersItHostsForThatDriver) {
  hub_->watch_agent(agent_, "test-agent");
  caf::actor stranger = sys_->system().spawn(silent_agent);  // not spawned by the agent
  WorkerRef ref{stranger, WorkerContext{"g", 4, 5, 0, 1, "cpu:0", "test-host", "", 0}, false,
                agent_, nullptr};
  CallRequest req;
  req.method = "rank_info";
  auto batch = hub_->call({ref}, {req});
  sched().run();
  ASSERT_TRUE(batch->ready());
  Status st = batch->wait()[0].status();
  EXPECT_EQ(st.code(), ErrorCode::unavailable);
  for (const char* part : {"rank 4", "'rank_info'", "not hosted"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.message();
  }
  caf::anon_send_exit(stranger, caf::exit_reason::kill);
  sched().run();
}

// A peer posing as an agent that answers every AgentCall with `reply`.
caf::behavior scripted_agent(caf::event_based_actor* self, AgentCallReply reply) {
  return {[=](call_atom, uint64_t id, const AgentCall&) {
    self->send(caf::actor_cast<caf::actor>(self->current_sender()), reply_atom::value, id, reply);
  }};
}

// An agent whose worker hangs: it answers only when told to (go_atom), after the deadline,
// with a result carrying a payload handle, and records what the caller asks it to release.
using go_atom = caf::atom_constant<caf::atom("test_go")>;
struct HungAgentLog {
  std::vector<PayloadHandle> released;
};
caf::behavior hung_agent(caf::event_based_actor* self, std::shared_ptr<HungAgentLog> log) {
  auto caller = std::make_shared<std::pair<caf::actor, uint64_t>>();
  return {
      [=](call_atom, uint64_t id, const AgentCall&) {
        *caller = {caf::actor_cast<caf::actor>(self->current_sender()), id};
      },
      [=](go_atom, const PayloadHandle& h) {
        WireValue result;
        result.kind = static_cast<uint8_t>(WireKind::proto_slices);
        result.slices.push_back(PayloadSlice{h, 0, h.rows});
        self->send(caller->first, reply_atom::value, caller->second,
                   AgentCallReply{{0}, {""}, {result}});
      },
      [=](release_atom, const std::vector<PayloadHandle>& hs) {
        log->released.insert(log->released.end(), hs.begin(), hs.end());
      },
  };
}

TEST_F(WorkerActorTest, AHungRemoteWorkersCallReleasesEverythingAtItsDeadline) {
  auto log = std::make_shared<HungAgentLog>();
  caf::actor agent = sys_->system().spawn(hung_agent, log);
  hub_->watch_agent(agent, "node-h:7700");
  WorkerRef ref{agent, WorkerContext{"g", 2, 4, 0, 1, "cpu:0", "node-h", "", 0}, false, agent, nullptr};
  CallCounters before = call_counters();
  CallRequest req;
  req.method = "compute_log_prob";
  auto batch = hub_->call({ref}, {req}, Millis(50));
  sched().run();
  EXPECT_EQ(hub_->pending_calls(), 1u);
  sched().trigger_timeouts();
  sched().run();
  ASSERT_TRUE(batch->ready());
  Status st = batch->wait()[0].status();
  EXPECT_EQ(st.code(), ErrorCode::timeout);
  EXPECT_NE(st.message().find("rank 2"), std::string::npos) << st.message();
  EXPECT_EQ(hub_->pending_calls(), 0u);  // the pending entry is gone at the deadline
  batch.reset();
  EXPECT_EQ(call_counters().live_batches, before.live_batches);  // nothing else holds it
  // The worker answers late, with a payload published for the caller.
  PayloadHandle late = dp_->publish(make_batch(3), 1);
  caf::anon_send(agent, go_atom::value, late);
  sched().run();
  CallCounters after = call_counters();
  EXPECT_EQ(after.late_replies_dropped, before.late_replies_dropped + 1);
  EXPECT_EQ(after.late_payloads_released, before.late_payloads_released + 1);
  ASSERT_EQ(log->released.size(), 1u);  // the hub asked the agent to free it
  EXPECT_EQ(log->released[0].id, late.id);
  EXPECT_EQ(hub_->pending_calls(), 0u);
  (void)dp_->release(late);
  caf::anon_send_exit(agent, caf::exit_reason::kill);
  sched().run();
}

TEST_F(WorkerActorTest, AMalformedAgentReplyIsAnErrorNotAnOverRead) {
  AgentCallReply no_answers;                                  // 0 answers for 1 call
  AgentCallReply unknown_code{{200}, {"?"}, {WireValue{}}};  // no such ErrorCode
  for (const AgentCallReply& reply : {no_answers, unknown_code}) {
    caf::actor fake = sys_->system().spawn(scripted_agent, reply);
    hub_->watch_agent(fake, "node-c:7700");
    WorkerRef ref{fake, WorkerContext{"g", 5, 6, 1, 2, "cpu:1", "node-c", "", 0}, false, fake, nullptr};
    CallRequest req;
    req.method = "compute_values";
    auto batch = hub_->call({ref}, {req});
    sched().run();
    ASSERT_TRUE(batch->ready());
    Status st = batch->wait()[0].status();
    EXPECT_EQ(st.code(), ErrorCode::corrupt_data) << st.to_string();
    EXPECT_NE(st.message().find("rank 5"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("'compute_values'"), std::string::npos) << st.message();
    caf::anon_send_exit(fake, caf::exit_reason::kill);
    sched().run();
  }
}

TEST_F(WorkerActorTest, ABatchCallsEveryRankInParallel) {
  std::vector<WorkerRef> refs;
  for (int r = 0; r < 3; ++r) refs.push_back(*spawn(r, {{"", "echo", "{}"}}));
  std::vector<CallRequest> reqs(3);
  for (auto& q : reqs) q.method = "rank_info";
  auto batch = hub_->call(refs, reqs);
  sched().run();
  auto results = batch->wait();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok());
    EXPECT_EQ(from_wire(*results[r], *dp_, true)->json()["rank"], r);
  }
}

}  // namespace
}  // namespace tessera::runtime
