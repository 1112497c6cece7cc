// Checkpoint: single-file and sharded directories, and every way the index and its shards can disagree.
#include "formats/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "expect_error.h"
#include "safetensors_builder.h"

namespace kestrel {
namespace {

using testing::expect_error;
using testing::SafetensorsBuilder;
using testing::ScratchDir;
using testing::write_file;

SafetensorsBuilder shard_with(const std::vector<std::string>& names) {
  SafetensorsBuilder builder;
  float value = 0;
  for (const std::string& name : names) {
    builder.add_values<float>(name, "F32", {2}, {value, value + 1});
    value += 2;
  }
  return builder;
}

std::string weight_map_index(const std::string& weight_map_json) {
  return R"({"metadata": {"total_size": 16}, "weight_map": )" + weight_map_json + "}";
}

TEST(CheckpointTest, OpensSingleFile) {
  ScratchDir dir;
  shard_with({"b", "a"}).write(dir.file("model.safetensors"));
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint.dir(), dir.path());
  EXPECT_EQ(checkpoint.config_path(), dir.path() + "/config.json");
  EXPECT_EQ(checkpoint.num_shards(), 1u);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(checkpoint.get("a").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(*checkpoint.get("a").path, dir.file("model.safetensors"));
  EXPECT_EQ(checkpoint.find("c"), nullptr);
}

TEST(CheckpointTest, OpensShardsThroughIndex) {
  ScratchDir dir;
  testing::write_sharded_checkpoint(dir.path(), {{"model-00001-of-00002.safetensors", shard_with({"x", "y"})},
                                                 {"model-00002-of-00002.safetensors", shard_with({"z"})}});
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint.num_shards(), 2u);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(*checkpoint.get("x").path, dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(*checkpoint.get("z").path, dir.file("model-00002-of-00002.safetensors"));
  float z0;
  std::memcpy(&z0, checkpoint.get("z").data, sizeof z0);
  EXPECT_EQ(z0, 0.0f);
}

TEST(CheckpointTest, CheckpointStaysValidAfterMove) {
  ScratchDir dir;
  shard_with({"a"}).write(dir.file("model.safetensors"));
  Checkpoint original = Checkpoint::open(dir.path());
  const TensorView* before = &original.get("a");
  const Checkpoint moved = std::move(original);
  EXPECT_EQ(&moved.get("a"), before);
}

TEST(CheckpointTest, SingleFileWinsOverIndex) {
  ScratchDir dir;
  shard_with({"a"}).write(dir.file("model.safetensors"));
  write_file(dir.file("model.safetensors.index.json"), "not even json");
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"a"}));
}

TEST(CheckpointTest, RejectsDirectoryWithoutWeights) {
  ScratchDir dir;
  write_file(dir.file("config.json"), "{}");
  expect_error([&] { Checkpoint::open(dir.path()); },
               {dir.path() + ": no model.safetensors or model.safetensors.index.json"});
}

TEST(CheckpointTest, RejectsMissingDirectory) {
  ScratchDir dir;
  expect_error([&] { Checkpoint::open(dir.file("nope")); }, {dir.file("nope") + ": not a directory"});
}

TEST(CheckpointTest, GetOfAbsentTensorNamesDirAndTensor) {
  ScratchDir dir;
  shard_with({"a"}).write(dir.file("model.safetensors"));
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  expect_error([&] { checkpoint.get("lm_head.weight"); }, {dir.path() + ": tensor lm_head.weight is missing"});
}

TEST(CheckpointTest, ReportsMalformedShardByItsPath) {
  ScratchDir dir;
  SafetensorsBuilder bad;
  bad.add("w", "F32", {4}, std::string(4, '\0'));
  bad.write(dir.file("model.safetensors"));
  expect_error([&] { Checkpoint::open(dir.path()); }, {dir.file("model.safetensors") + ": tensor 'w'"});
}

class CheckpointIndexTest : public ::testing::Test {
protected:
  void write_index(const std::string& text) { write_file(index_path_, text); }
  std::string open_error(std::initializer_list<std::string_view> fragments) {
    return expect_error([&] { Checkpoint::open(dir_.path()); }, fragments);
  }

  ScratchDir dir_;
  std::string index_path_ = dir_.file("model.safetensors.index.json");
};

TEST_F(CheckpointIndexTest, RejectsInvalidIndexJson) {
  write_index("{\"weight_map\": ");
  open_error({index_path_ + ": invalid JSON"});
}

TEST_F(CheckpointIndexTest, RejectsMissingWeightMap) {
  write_index(R"({"metadata": {}})");
  open_error({index_path_ + ": missing 'weight_map'"});
}

TEST_F(CheckpointIndexTest, RejectsWeightMapThatIsNotAnObject) {
  write_index(R"({"weight_map": ["a"]})");
  open_error({index_path_ + ": 'weight_map' must be an object"});
}

TEST_F(CheckpointIndexTest, RejectsEmptyWeightMap) {
  write_index(R"({"weight_map": {}})");
  open_error({index_path_ + ": 'weight_map' is empty"});
}

TEST_F(CheckpointIndexTest, RejectsNonStringShard) {
  write_index(weight_map_index(R"({"a": 1})"));
  open_error({index_path_, "tensor 'a'", "shard must be a file name string"});
}

TEST_F(CheckpointIndexTest, RejectsDuplicateWeightMapKey) {
  shard_with({"a"}).write(dir_.file("s1.safetensors"));
  write_index(weight_map_index(R"({"a": "s1.safetensors", "a": "s2.safetensors"})"));
  open_error({index_path_, "key 'a' appears more than once"});
}

TEST_F(CheckpointIndexTest, RejectsShardOutsideDirectory) {
  write_index(weight_map_index(R"({"a": "../model.safetensors"})"));
  open_error({index_path_, "tensor 'a'", "shard '../model.safetensors' is not a plain file name"});
}

TEST_F(CheckpointIndexTest, RejectsShardInSubdirectory) {
  write_index(weight_map_index(R"({"a": "sub/model.safetensors"})"));
  open_error({"tensor 'a'", "shard 'sub/model.safetensors' is not a plain file name"});
}

TEST_F(CheckpointIndexTest, RejectsDotDotShard) {
  write_index(weight_map_index(R"({"a": ".."})"));
  open_error({"tensor 'a'", "shard '..' is not a plain file name"});
}

TEST_F(CheckpointIndexTest, RejectsMissingShardFile) {
  shard_with({"a"}).write(dir_.file("s1.safetensors"));
  write_index(weight_map_index(R"({"a": "s1.safetensors", "b": "s2.safetensors"})"));
  open_error({index_path_, "tensor 'b' is listed in shard 's2.safetensors', which does not exist"});
}

TEST_F(CheckpointIndexTest, RejectsListedTensorAbsentFromShard) {
  shard_with({"a"}).write(dir_.file("s1.safetensors"));
  write_index(weight_map_index(R"({"a": "s1.safetensors", "b": "s1.safetensors"})"));
  open_error({dir_.file("s1.safetensors") + ": tensor 'b' is listed in model.safetensors.index.json but that shard "
                                            "does not contain it"});
}

TEST_F(CheckpointIndexTest, RejectsUnlistedTensorInShard) {
  shard_with({"a", "extra"}).write(dir_.file("s1.safetensors"));
  write_index(weight_map_index(R"({"a": "s1.safetensors"})"));
  open_error({dir_.file("s1.safetensors") + ": tensor 'extra' is not listed in model.safetensors.index.json"});
}

TEST_F(CheckpointIndexTest, RejectsTensorInTwoShards) {
  shard_with({"a", "shared"}).write(dir_.file("s1.safetensors"));
  shard_with({"b", "shared"}).write(dir_.file("s2.safetensors"));
  write_index(weight_map_index(R"({"a": "s1.safetensors", "b": "s2.safetensors", "shared": "s1.safetensors"})"));
  open_error({dir_.file("s2.safetensors") + ": tensor 'shared' is in this shard, but model.safetensors.index.json "
                                            "assigns it to 's1.safetensors'"});
}

}  // namespace
}  // namespace kestrel
