// Tests of the method registry (verl's @register) and colocated-role prefixes.
#include <gtest/gtest.h>

#include "dispatch/methods.hpp"

namespace tessera::dispatch {
namespace {

MethodFn echo(int tag) {
  return [tag](const Args& a) -> Result<Value> { return Value(nlohmann::json{{"tag", tag}, {"argc", a.size()}}); };
}

TEST(MethodTable, RecordsSpecsAndInvokes) {
  MethodTable t;
  ASSERT_TRUE(t.add("init_model", Dispatch::ONE_TO_ALL, echo(1)).ok());
  MethodSpec spec;
  spec.name = "update_actor";
  spec.dispatch_mode = Dispatch::DP_COMPUTE_PROTO;
  spec.blocking = false;
  spec.execute_mode = ExecuteMode::rank_zero;
  ASSERT_TRUE(t.add(spec, echo(2)).ok());
  auto s = t.spec("update_actor");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dispatch_mode, Dispatch::DP_COMPUTE_PROTO);
  EXPECT_FALSE(s->blocking);
  EXPECT_EQ(s->execute_mode, ExecuteMode::rank_zero);
  auto out = t.invoke("init_model", {Value(1), Value(2)});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->json()["tag"], 1);
  EXPECT_EQ(out->json()["argc"], 2);
  EXPECT_EQ(t.specs().size(), 2u);
  EXPECT_EQ(t.specs()[0].name, "init_model");
}

TEST(MethodTable, DefaultsAreVerls) {
  MethodSpec s;
  EXPECT_EQ(s.dispatch_mode, Dispatch::ALL_TO_ALL);
  EXPECT_EQ(s.execute_mode, ExecuteMode::all);
  EXPECT_TRUE(s.blocking);
  EXPECT_TRUE(s.materialize_futures);
}

TEST(MethodTable, RejectsBadRegistrations) {
  MethodTable t;
  ASSERT_TRUE(t.add("m", Dispatch::ONE_TO_ALL, echo(1)).ok());
  EXPECT_EQ(t.add("m", Dispatch::ONE_TO_ALL, echo(1)).code(), ErrorCode::already_exists);
  EXPECT_EQ(t.add("x", "NO_SUCH_MODE", echo(1)).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(t.add("", Dispatch::ONE_TO_ALL, echo(1)).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(t.add("y", Dispatch::ONE_TO_ALL, MethodFn{}).code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(t.add("z", "nd:actor", echo(3)).ok()) << "n-d modes resolve by name";
  auto missing = t.invoke("nope", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::not_found);
  EXPECT_NE(missing.status().message().find("registered: m"), std::string::npos) << missing.status().message();
}

TEST(MethodTable, ColocatedRolesArePrefixedAndViewedBack) {
  MethodTable actor, critic, fused;
  ASSERT_TRUE(actor.add("init_model", Dispatch::ONE_TO_ALL, echo(1)).ok());
  ASSERT_TRUE(actor.add("update_actor", Dispatch::DP_COMPUTE_PROTO, echo(2)).ok());
  ASSERT_TRUE(critic.add("init_model", Dispatch::ONE_TO_ALL, echo(3)).ok());
  ASSERT_TRUE(fused.merge_with_prefix("actor_rollout", actor).ok());
  ASSERT_TRUE(fused.merge_with_prefix("critic", critic).ok());
  EXPECT_EQ(fused.size(), 3u);
  EXPECT_EQ(fused.invoke("critic_init_model", {})->json()["tag"], 3);
  EXPECT_EQ(fused.invoke("actor_rollout_init_model", {})->json()["tag"], 1);
  EXPECT_EQ(fused.merge_with_prefix("critic", critic).code(), ErrorCode::already_exists);
  auto view = role_view(fused.specs(), "actor_rollout");
  ASSERT_EQ(view.size(), 2u);
  EXPECT_EQ(view[0].name, "init_model");
  EXPECT_EQ(view[1].name, "update_actor");
  EXPECT_EQ(view[1].dispatch_mode, Dispatch::DP_COMPUTE_PROTO);
  EXPECT_EQ(role_view(fused.specs(), "critic").size(), 1u);
}

}  // namespace
}  // namespace tessera::dispatch
