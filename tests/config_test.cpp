// Tests of the configuration parser (stitch::Config::parse / to_string): PyTorch's
// `key:value,...` syntax, every key, the error messages and the round trip through to_string().
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/keys.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"

namespace stitch {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

/// The message of the config_error `conf` raises ("" if it parses).
std::string error_of(std::string_view conf) {
  try {
    (void)Config::parse(conf);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

void expect_same_settings(const Config& a, const Config& b) {
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.sim_capacity_mb, b.sim_capacity_mb);
  EXPECT_EQ(a.sim_devices, b.sim_devices);
  EXPECT_EQ(a.max_split_size, b.max_split_size);
  EXPECT_EQ(a.max_non_split_rounding, b.max_non_split_rounding);
  EXPECT_EQ(a.roundup_power2_divisions, b.roundup_power2_divisions);
  EXPECT_EQ(a.garbage_collection_threshold, b.garbage_collection_threshold);
  EXPECT_EQ(a.expandable_segments, b.expandable_segments);
  EXPECT_EQ(a.per_process_memory_fraction, b.per_process_memory_fraction);
  EXPECT_EQ(a.on_invalid_free, b.on_invalid_free);
  EXPECT_EQ(a.record_history, b.record_history);
  EXPECT_EQ(a.max_entries, b.max_entries);
  EXPECT_EQ(a.record_stacks, b.record_stacks);
  EXPECT_EQ(a.record_python_stacks, b.record_python_stacks);
  EXPECT_EQ(a.oom_snapshot, b.oom_snapshot);
  EXPECT_EQ(a.oom_what_if, b.oom_what_if);
}

// ---- defaults -----------------------------------------------------------------------------------

TEST(ConfigDefaults, MatchPyTorch) {
  const Config c;
  EXPECT_EQ(c.backend, BackendKind::cuda);
  EXPECT_EQ(c.max_split_size, Config::kUnlimited);
  EXPECT_EQ(c.max_non_split_rounding, 20 * MiB);
  for (auto d : c.roundup_power2_divisions) EXPECT_EQ(d, 0u);
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(c.per_process_memory_fraction, 1.0);
  EXPECT_EQ(c.on_invalid_free, InvalidFreePolicy::error);
}

TEST(ConfigParse, EmptyStringReturnsTheBaseUnchanged) {
  Config base;
  base.sim_devices = 3;
  base.max_split_size = 64 * MiB;
  const Config c = Config::parse("", base);
  expect_same_settings(c, base);
  EXPECT_EQ(c.source, base.source);
}

TEST(ConfigParse, ParsesOnTopOfTheBase) {
  Config base;
  base.sim_devices = 3;
  const Config c = Config::parse("sim_capacity_mb:100", base);
  EXPECT_EQ(c.sim_devices, 3);
  EXPECT_EQ(c.sim_capacity_mb, 100u);
}

TEST(ConfigParse, RemembersTheSourceString) {
  EXPECT_EQ(Config::parse("backend:sim,sim_devices:2").source, "backend:sim,sim_devices:2");
  EXPECT_EQ(Config::parse(" backend : sim , roundup_power2_divisions:[256:1, >:4]").source,
            "backend:sim,roundup_power2_divisions:[256:1,>:4]");
}

TEST(ConfigKeys, RecordStacksNamesTheKindsOfFrames) {
  struct Case { const char* value; bool native, python; };
  for (const Case& k : {Case{"True", true, false}, Case{"cpp", true, false},
                        Case{"python", false, true}, Case{"all", true, true},
                        Case{"False", false, false}}) {
    const Config c = Config::parse(std::string("record_stacks:") + k.value);
    EXPECT_EQ(c.record_stacks, k.native) << k.value;
    EXPECT_EQ(c.record_python_stacks, k.python) << k.value;
    const Config again = Config::parse(c.to_string());  // prints what parses back
    EXPECT_EQ(again.record_stacks, k.native) << k.value;
    EXPECT_EQ(again.record_python_stacks, k.python) << k.value;
  }
}

TEST(ConfigParse, TheSourceIsEveryItemGivenSoFarWithoutTheRecordersSwitches) {
  // The environment, then configure() calls: a later item for a key replaces it in place.
  const Config env = Config::parse("backend:sim,max_split_size_mb:64,expandable_segments:True");
  Config c = Config::parse("garbage_collection_threshold:0.8,max_split_size_mb:128", env);
  EXPECT_EQ(c.source,
            "backend:sim,max_split_size_mb:128,expandable_segments:True,"
            "garbage_collection_threshold:0.8");
  // Turning the history on is not a setting of the allocator.
  c = Config::parse("record_history:True,max_entries:100000,record_stacks:True", c);
  EXPECT_TRUE(c.record_history);
  EXPECT_EQ(c.source,
            "backend:sim,max_split_size_mb:128,expandable_segments:True,"
            "garbage_collection_threshold:0.8");
  EXPECT_EQ(Config::parse("record_history:True").source, "");
}

// ---- every key ----------------------------------------------------------------------------------

TEST(ConfigKeys, Backend) {
  EXPECT_EQ(Config::parse("backend:sim").backend, BackendKind::sim);
  EXPECT_EQ(Config::parse("backend:cuda").backend, BackendKind::cuda);
  EXPECT_STREQ(to_string(BackendKind::sim), "sim");
  EXPECT_STREQ(to_string(BackendKind::cuda), "cuda");
}

TEST(ConfigKeys, SimCapacityMb) {
  EXPECT_EQ(Config::parse("sim_capacity_mb:1").sim_capacity_mb, 1u);
  EXPECT_EQ(Config::parse("sim_capacity_mb:81920").sim_capacity_mb, 81920u);
}

TEST(ConfigKeys, SimDevices) {
  EXPECT_EQ(Config::parse("sim_devices:1").sim_devices, 1);
  EXPECT_EQ(Config::parse("sim_devices:8").sim_devices, 8);
  EXPECT_EQ(Config::parse("sim_devices:64").sim_devices, 64);
}

TEST(ConfigKeys, MaxSplitSizeMbIsStoredInBytes) {
  EXPECT_EQ(Config::parse("max_split_size_mb:20").max_split_size, 20 * MiB);
  EXPECT_EQ(Config::parse("max_split_size_mb:512").max_split_size, 512 * MiB);
}

TEST(ConfigKeys, MaxNonSplitRoundingMbIsStoredInBytes) {
  EXPECT_EQ(Config::parse("max_non_split_rounding_mb:20").max_non_split_rounding, 20 * MiB);
  EXPECT_EQ(Config::parse("max_non_split_rounding_mb:256").max_non_split_rounding, 256 * MiB);
}

TEST(ConfigKeys, RoundupPower2DivisionsSingleValueFillsEveryInterval) {
  const Config c = Config::parse("roundup_power2_divisions:4");
  for (auto d : c.roundup_power2_divisions) EXPECT_EQ(d, 4u);
  const Config off = Config::parse("roundup_power2_divisions:0");
  for (auto d : off.roundup_power2_divisions) EXPECT_EQ(d, 0u);
}

TEST(ConfigKeys, RoundupPower2DivisionsList) {
  // PyTorch's example: the first key also covers every interval below it, '>' the rest.
  const Config c = Config::parse("roundup_power2_divisions:[256:1,512:2,>:8]");
  const auto& d = c.roundup_power2_divisions;
  for (std::size_t i = 0; i <= 8; ++i) EXPECT_EQ(d[i], 1u) << i;  // < 512 MiB
  EXPECT_EQ(d[9], 2u);                                            // [512 MiB, 1 GiB)
  for (std::size_t i = 10; i < 16; ++i) EXPECT_EQ(d[i], 8u) << i; // from 1 GiB
}

TEST(ConfigKeys, RoundupPower2DivisionsListWithEveryInterval) {
  const Config c = Config::parse(
      "roundup_power2_divisions:[1:2,2:4,4:8,8:16,16:32,32:64,64:128,128:256,256:512,512:1024,"
      "1024:0,2048:2,4096:4,8192:8,16384:16,>:32]");
  const std::uint32_t want[16] = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 0, 2, 4, 8, 16, 32};
  for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(c.roundup_power2_divisions[i], want[i]) << i;
}

TEST(ConfigKeys, GarbageCollectionThreshold) {
  EXPECT_DOUBLE_EQ(Config::parse("garbage_collection_threshold:0.6").garbage_collection_threshold,
                   0.6);
  EXPECT_DOUBLE_EQ(Config::parse("garbage_collection_threshold:0.01").garbage_collection_threshold,
                   0.01);
}

TEST(ConfigKeys, ExpandableSegments) {
  EXPECT_TRUE(Config::parse("expandable_segments:True").expandable_segments);
  EXPECT_FALSE(Config::parse("expandable_segments:True,expandable_segments:False").expandable_segments);
}

TEST(ConfigKeys, PerProcessMemoryFraction) {
  EXPECT_DOUBLE_EQ(Config::parse("per_process_memory_fraction:0.5").per_process_memory_fraction, 0.5);
  EXPECT_DOUBLE_EQ(Config::parse("per_process_memory_fraction:1").per_process_memory_fraction, 1.0);
}

TEST(ConfigKeys, OnInvalidFree) {
  EXPECT_EQ(Config::parse("on_invalid_free:abort").on_invalid_free, InvalidFreePolicy::abort);
  EXPECT_EQ(Config::parse("on_invalid_free:error").on_invalid_free, InvalidFreePolicy::error);
}

TEST(ConfigKeys, DiagnosticsKeys) {
  const Config c = Config::parse(
      "record_history:True,max_entries:5000,record_stacks:True,oom_snapshot:/tmp/stitch_oom.pickle");
  EXPECT_TRUE(c.record_history);
  EXPECT_EQ(c.max_entries, 5000u);
  EXPECT_TRUE(c.record_stacks);
  EXPECT_EQ(c.oom_snapshot, "/tmp/stitch_oom.pickle");
  const Config off = Config::parse("record_history:False,record_stacks:False", c);
  EXPECT_FALSE(off.record_history);
  EXPECT_FALSE(off.record_stacks);
}

TEST(ConfigKeys, SeveralKeysAtOnceLaterWins) {
  const Config c = Config::parse("backend:sim,sim_devices:2,max_split_size_mb:40,sim_devices:3");
  EXPECT_EQ(c.backend, BackendKind::sim);
  EXPECT_EQ(c.sim_devices, 3);
  EXPECT_EQ(c.max_split_size, 40 * MiB);
}

// ---- syntax ---------------------------------------------------------------------------------------

TEST(ConfigSyntax, SpacesAreIgnored) {
  const Config c = Config::parse(
      " backend : sim , max_split_size_mb: 64 ,roundup_power2_divisions : [ 256 : 1 , > : 4 ] ");
  EXPECT_EQ(c.backend, BackendKind::sim);
  EXPECT_EQ(c.max_split_size, 64 * MiB);
  EXPECT_EQ(c.roundup_power2_divisions[0], 1u);
  EXPECT_EQ(c.roundup_power2_divisions[9], 4u);
}

TEST(ConfigSyntax, TrailingCommaIsAccepted) {
  EXPECT_EQ(Config::parse("backend:sim,").backend, BackendKind::sim);
}

TEST(ConfigSyntax, MissingColonIsAnError) {
  EXPECT_THROW((void)Config::parse("backend"), config_error);
  EXPECT_THROW((void)Config::parse("backend sim"), config_error);
}

TEST(ConfigSyntax, MissingValueIsAnError) {
  EXPECT_THROW((void)Config::parse("backend:"), config_error);
  EXPECT_THROW((void)Config::parse("sim_devices:,backend:sim"), config_error);
}

TEST(ConfigSyntax, UnterminatedListIsAnError) {
  EXPECT_THROW((void)Config::parse("roundup_power2_divisions:[256:1,>:4"), config_error);
  EXPECT_THROW((void)Config::parse("roundup_power2_divisions:[256:1"), config_error);
}

TEST(ConfigSyntax, TwoValuesWithoutCommaIsAnError) {
  EXPECT_THROW((void)Config::parse("backend:sim:cuda"), config_error);
}

TEST(ConfigSyntax, ConfigErrorIsAStitchError) {
  try {
    (void)Config::parse("bogus:1");
    FAIL() << "no exception";
  } catch (const error& e) {
    EXPECT_NE(dynamic_cast<const config_error*>(&e), nullptr);
  }
}

// ---- errors -----------------------------------------------------------------------------------------

TEST(ConfigErrors, UnknownKeyNamesTheKeyAndListsAcceptedKeys) {
  const std::string msg = error_of("backend:sim,max_spilt_size_mb:64");
  ASSERT_FALSE(msg.empty());
  EXPECT_TRUE(contains(msg, "max_spilt_size_mb")) << msg;
  for (const char* key :
       {"backend", "sim_capacity_mb", "sim_devices", "max_split_size_mb",
        "max_non_split_rounding_mb", "roundup_power2_divisions", "garbage_collection_threshold",
        "expandable_segments", "per_process_memory_fraction", "on_invalid_free"}) {
    EXPECT_TRUE(contains(msg, key)) << key << " missing from: " << msg;
  }
}

struct BadValue {
  const char* conf;
  const char* key;
  const char* accepted;  ///< part of the accepted-values text
};

class ConfigBadValue : public ::testing::TestWithParam<BadValue> {};

TEST_P(ConfigBadValue, MessageNamesKeyValueAndAcceptedValues) {
  const BadValue& p = GetParam();
  const std::string msg = error_of(p.conf);
  ASSERT_FALSE(msg.empty()) << p.conf << " was accepted";
  EXPECT_TRUE(contains(msg, p.key)) << msg;
  EXPECT_TRUE(contains(msg, p.accepted)) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    AllKeys, ConfigBadValue,
    ::testing::Values(
        BadValue{"backend:rocm", "backend", "cuda or sim"},
        BadValue{"backend:Sim", "backend", "cuda or sim"},
        BadValue{"sim_capacity_mb:0", "sim_capacity_mb", ">= 1"},
        BadValue{"sim_capacity_mb:-5", "sim_capacity_mb", ">= 1"},
        BadValue{"sim_capacity_mb:12MB", "sim_capacity_mb", ">= 1"},
        BadValue{"sim_devices:0", "sim_devices", "1 to 64"},
        BadValue{"sim_devices:65", "sim_devices", "1 to 64"},
        BadValue{"sim_devices:two", "sim_devices", "1 to 64"},
        BadValue{"max_split_size_mb:19", "max_split_size_mb", ">= 20"},
        BadValue{"max_split_size_mb:0", "max_split_size_mb", ">= 20"},
        BadValue{"max_split_size_mb:1.5", "max_split_size_mb", ">= 20"},
        BadValue{"max_non_split_rounding_mb:10", "max_non_split_rounding_mb", ">= 20"},
        BadValue{"roundup_power2_divisions:3", "roundup_power2_divisions", "power of two"},
        BadValue{"roundup_power2_divisions:2048", "roundup_power2_divisions", "power of two"},
        BadValue{"roundup_power2_divisions:[300:2,>:4]", "roundup_power2_divisions", "power of two"},
        BadValue{"roundup_power2_divisions:[256:3]", "roundup_power2_divisions", "power of two"},
        BadValue{"roundup_power2_divisions:[512:2,256:4]", "roundup_power2_divisions", "power of two"},
        BadValue{"garbage_collection_threshold:0", "garbage_collection_threshold", "between 0 and 1"},
        BadValue{"garbage_collection_threshold:1", "garbage_collection_threshold", "between 0 and 1"},
        BadValue{"garbage_collection_threshold:1.5", "garbage_collection_threshold", "between 0 and 1"},
        BadValue{"garbage_collection_threshold:-0.5", "garbage_collection_threshold", "between 0 and 1"},
        BadValue{"garbage_collection_threshold:abc", "garbage_collection_threshold", "between 0 and 1"},
        BadValue{"garbage_collection_threshold:nan", "garbage_collection_threshold", "between 0 and 1"},
        BadValue{"expandable_segments:true", "expandable_segments", "True or False"},
        BadValue{"expandable_segments:1", "expandable_segments", "True or False"},
        BadValue{"per_process_memory_fraction:1.1", "per_process_memory_fraction", "[0, 1]"},
        BadValue{"per_process_memory_fraction:-0.1", "per_process_memory_fraction", "[0, 1]"},
        BadValue{"per_process_memory_fraction:inf", "per_process_memory_fraction", "[0, 1]"},
        BadValue{"on_invalid_free:ignore", "on_invalid_free", "error or abort"},
        BadValue{"record_history:yes", "record_history", "True or False"},
        BadValue{"record_stacks:1", "record_stacks", "True, False, cpp, python or all"},
        BadValue{"oom_what_if:on", "oom_what_if", "True or False"},
        BadValue{"max_entries:0", "max_entries", "1 to 2^32"},
        BadValue{"max_entries:many", "max_entries", "1 to 2^32"}));

TEST(ConfigErrors, BadValueMessageQuotesTheValue) {
  const std::string msg = error_of("sim_devices:99");
  EXPECT_TRUE(contains(msg, "99")) << msg;
}

TEST(ConfigErrors, ParseErrorLeavesNothingHalfApplied) {
  // parse() returns a new Config; a failing parse must not be observable through the base.
  Config base;
  base.sim_devices = 2;
  EXPECT_THROW((void)Config::parse("sim_devices:4,bogus:1", base), config_error);
  EXPECT_EQ(base.sim_devices, 2);
}

// ---- to_string round trip ---------------------------------------------------------------------

TEST(ConfigToString, DefaultsRoundTrip) {
  const Config c;
  const Config back = Config::parse(c.to_string());
  expect_same_settings(back, c);
}

TEST(ConfigToString, EverySettingRoundTrips) {
  const Config c = Config::parse(
      "backend:sim,sim_capacity_mb:4096,sim_devices:3,max_split_size_mb:200,"
      "max_non_split_rounding_mb:64,roundup_power2_divisions:[1:2,64:4,1024:16,>:0],"
      "garbage_collection_threshold:0.65,expandable_segments:True,"
      "per_process_memory_fraction:0.123456789,on_invalid_free:abort,record_history:True,"
      "max_entries:777,record_stacks:True,oom_snapshot:/tmp/oom.pickle,oom_what_if:False");
  const std::string text = c.to_string();
  const Config back = Config::parse(text);
  expect_same_settings(back, c);
  // And the text is stable: printing the parsed copy gives the same string.
  EXPECT_EQ(back.to_string(), text);
}

TEST(ConfigToString, UnlimitedMaxSplitSizeRoundTrips) {
  Config c = Config::parse("max_split_size_mb:100");
  c.max_split_size = Config::kUnlimited;
  EXPECT_EQ(Config::parse(c.to_string()).max_split_size, Config::kUnlimited);
}

TEST(ConfigToString, NamesEveryKey) {
  const std::string text =
      Config::parse("max_split_size_mb:20,garbage_collection_threshold:0.5,oom_snapshot:/tmp/x")
          .to_string();
  for (const char* key :
       {"backend:", "sim_capacity_mb:", "sim_devices:", "max_split_size_mb:",
        "max_non_split_rounding_mb:", "roundup_power2_divisions:", "garbage_collection_threshold:",
        "expandable_segments:", "per_process_memory_fraction:", "on_invalid_free:",
        "record_history:", "max_entries:", "record_stacks:", "oom_snapshot:", "oom_what_if:"}) {
    EXPECT_TRUE(contains(text, key)) << key << " missing from " << text;
  }
}

// ---- the key table -------------------------------------------------------------------------------

TEST(ConfigTable, EveryKeyParsesItsOwnPrintedValue) {
  // Each key's printed value, fed back to the key alone, prints the same (keys a default leaves
  // out of to_string are set first).
  const Config c = Config::parse(
      "max_split_size_mb:64,garbage_collection_threshold:0.5,expandable_segments:True,"
      "stitching:True,stitch_before_grow_mb:8,stitch_compact:True,oom_snapshot:/tmp/x.pickle,"
      "peer_access:True,ipc:False,sim_host_mb:64,spill:all,spill_limit_mb:16,kv_reserve_mb:8,kv_zero_page:True,"
      "backup_dir:/tmp/a dir:1,backup_dir_mb:4,backup_host_mb:2");
  for (const detail::KeySpec& key : detail::config_keys()) {
    SCOPED_TRACE(std::string(key.name));
    const std::string value = key.print(c);
    ASSERT_FALSE(value.empty());
    const Config back = Config::parse(std::string(key.name) + ":" + value, c);
    EXPECT_EQ(key.print(back), value);
  }
}

TEST(ConfigTable, ParseReportsTheKeysGiven) {
  std::vector<std::string> given;
  (void)Config::parse("expandable_segments:True, per_process_memory_fraction:0.5,"
                      "roundup_power2_divisions:[1:2,>:4]", Config{}, &given);
  EXPECT_EQ(given, (std::vector<std::string>{"expandable_segments", "per_process_memory_fraction",
                                             "roundup_power2_divisions"}));
}

TEST(ConfigTable, UnknownKeyMessageListsEveryKeyOfTheTable) {
  std::string message;
  try {
    (void)Config::parse("bogus:1");
  } catch (const config_error& e) {
    message = e.what();
  }
  for (const detail::KeySpec& key : detail::config_keys())
    EXPECT_TRUE(contains(message, key.name)) << key.name;
}

TEST(ConfigTable, FixedKeysCannotChangeOnceTheAllocatorExists) {
  Allocator a(Config::parse("backend:sim,sim_capacity_mb:64,sim_devices:2"));
  for (const detail::KeySpec& key : detail::config_keys()) {
    if (!key.fixed) continue;
    SCOPED_TRACE(std::string(key.name));
    const std::string now = key.print(a.config());  // a default may print nothing
    const bool boolean = std::string(key.accepted) == "True or False";
    const bool is_true = boolean && key.print(Config::parse(std::string(key.name) + ":True")) == now;
    const std::string other = key.name == "backend" ? "cuda" : boolean ? (is_true ? "False" : "True") : "3";
    try {
      a.configure(std::string(key.name) + ":" + other);
      ADD_FAILURE() << "a fixed key changed";
    } catch (const config_error& e) {
      EXPECT_TRUE(contains(e.what(), std::string(key.name) + " is fixed")) << e.what();
    }
    const std::string same = boolean ? (is_true ? "True" : "False") : now.empty() ? "0" : now;
    a.configure(std::string(key.name) + ":" + same);  // the same value is fine
  }
  a.configure("max_split_size_mb:40");  // tunables change
  EXPECT_EQ(a.config().max_split_size, std::size_t{40} << 20);
}

TEST(ConfigTable, TheReadmeDocumentsEveryKey) {
  const std::filesystem::path readme =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "README.md";
  std::ifstream in(readme);
  if (!in) GTEST_SKIP() << "no README.md at " << readme;
  std::stringstream text;
  text << in.rdbuf();
  for (const detail::KeySpec& key : detail::config_keys())
    EXPECT_TRUE(contains(text.str(), "`" + std::string(key.name) + "`")) << key.name << " is not in README.md";
}

// ---- backend:cuda without a driver ----------------------------------------------------------------

TEST(CudaBackend, WithoutADriverTheErrorSaysWhy) {
  // (Each ctest test is a process of its own: nothing has opened a driver yet.)
  ::setenv("STITCH_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 0);
  try {
    Allocator a(Config::parse("backend:cuda"));
    GTEST_SKIP() << "a CUDA driver is present: " << std::getenv("STITCH_CUDA_DRIVER");
  } catch (const backend_error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "backend:cuda: no CUDA device")) << what;
    EXPECT_TRUE(contains(what, "CUDA driver")) << what;
    EXPECT_TRUE(contains(what, "use backend:sim")) << what;
  }
}

}  // namespace
}  // namespace stitch
