// Status <-> caf::error, including after a round trip through CAF's binary serialisation
// (what crossing nodes does to an error).
#include <gtest/gtest.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/sec.hpp>

#include "runtime/actor_system.hpp"
#include "runtime/errors.hpp"

namespace tessera::runtime {
namespace {

TEST(Errors, StatusRoundTripsThroughCafError) {
  for (uint8_t c = 1; c <= static_cast<uint8_t>(ErrorCode::cancelled); ++c) {
    Status in(static_cast<ErrorCode>(c), "rank 3: key 'x' missing");
    Status out = to_status(to_caf_error(in));
    EXPECT_EQ(out.code(), in.code());
    EXPECT_EQ(out.message(), in.message());
  }
  EXPECT_TRUE(to_status(to_caf_error(Status())).ok());
}

TEST(Errors, SurvivesSerialisation) {
  RuntimeConfig cfg;
  auto sys = ActorSystem::start(cfg, ActorSystemOptions{false, true});
  ASSERT_TRUE(sys.ok()) << sys.status().to_string();
  caf::error err = to_caf_error(Status(ErrorCode::unavailable, "rank 1 on node-b died"));
  std::vector<char> buf;
  caf::binary_serializer sink((*sys)->system(), buf);
  ASSERT_FALSE(sink(err));
  caf::error back;
  caf::binary_deserializer source((*sys)->system(), buf);
  ASSERT_FALSE(source(back));
  Status st = to_status(back);
  EXPECT_EQ(st.code(), ErrorCode::unavailable);
  EXPECT_EQ(st.message(), "rank 1 on node-b died");
  EXPECT_NE((*sys)->system().render(back).find("rank 1 on node-b died"), std::string::npos);
}

TEST(Errors, CafSystemErrorsMapToTheClosestCode) {
  EXPECT_EQ(to_status(caf::make_error(caf::sec::request_timeout)).code(), ErrorCode::timeout);
  EXPECT_EQ(to_status(caf::make_error(caf::sec::request_receiver_down)).code(),
            ErrorCode::unavailable);
  EXPECT_EQ(to_status(caf::make_error(caf::exit_reason::remote_link_unreachable)).code(),
            ErrorCode::unavailable);
  EXPECT_NE(to_status(caf::make_error(caf::sec::request_timeout)).message().find("request_timeout"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::runtime
