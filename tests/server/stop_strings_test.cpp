#include "server/stop_strings.h"

#include <gtest/gtest.h>

namespace kestrel::server {
namespace {

std::string feed_all(StopStrings& s, const std::vector<std::string>& deltas, std::optional<std::string>* matched) {
  std::string out;
  for (const auto& d : deltas) {
    auto r = s.feed(d);
    out += r.text;
    if (r.matched) {
      *matched = r.matched;
      return out;
    }
  }
  return out + s.finish();
}

TEST(StopStrings, MatchSplitAcrossDeltasIsHeldBackAndCut) {
  StopStrings s({"STOP"}, false);
  auto r1 = s.feed("abcST");
  EXPECT_EQ(r1.text, "ab");  // "cST" could still begin "STOP"
  auto r2 = s.feed("OPxyz");
  EXPECT_EQ(r2.text, "c");
  ASSERT_TRUE(r2.matched);
  EXPECT_EQ(*r2.matched, "STOP");
  EXPECT_TRUE(s.stopped());
  EXPECT_TRUE(s.feed("more").text.empty());
}

TEST(StopStrings, NoMatchReleasesEverythingAtFinish) {
  StopStrings s({"STOP"}, false);
  std::optional<std::string> matched;
  EXPECT_EQ(feed_all(s, {"ST", "O", "P?", "no"}, &matched), "");  // everything before STOP was held
  ASSERT_TRUE(matched);
  StopStrings t({"STOP"}, false);
  matched.reset();
  EXPECT_EQ(feed_all(t, {"ST", "O", "X", "ST"}, &matched), "STOXST");
  EXPECT_FALSE(matched);
}

TEST(StopStrings, EarliestMatchWinsAndIncludeKeepsIt) {
  StopStrings s({"world", "lo w"}, true);
  auto r = s.feed("hello world");
  ASSERT_TRUE(r.matched);
  EXPECT_EQ(*r.matched, "lo w");
  EXPECT_EQ(r.text, "hello w");
}

TEST(StopStrings, NeverSplitsUtf8) {
  StopStrings s({"xyz"}, false);
  auto r = s.feed("a\xC3\xA9");  // "aé": holding 2 bytes would cut inside é
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(s.finish(), "\xC3\xA9");
}

TEST(StopStrings, UncheckedTextIsStillHeldForALaterMatch) {
  StopStrings s({"END"}, false);
  EXPECT_EQ(s.feed("aEN", /*check=*/false).text, "a");
  auto r = s.feed("D", true);
  ASSERT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");
}

TEST(StopStrings, NoStopsPassesThrough) {
  StopStrings s({}, false);
  EXPECT_EQ(s.feed("abc").text, "abc");
  EXPECT_EQ(s.finish(), "");
}

}  // namespace
}  // namespace kestrel::server
