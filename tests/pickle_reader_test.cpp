// Tests of the safe pickle reader (diagnostics/pickle_reader) and the pickle writer: every plain
// type and protocol 0-5 as CPython writes them, round trips, the real PyTorch snapshots in
// /work/shared/traces (skipped when absent), and hostile input: code-running opcodes, truncation,
// corruption, bad memo indices, cycles, depth and memory bombs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "tools/formats/pickle_reader.hpp"
#include "diagnostics/pickle_writer.hpp"
#include "diagnostics/snapshot_writer.hpp"
#include "stitch/errors.hpp"

namespace {

using stitch::formats::PickleLimits;
using stitch::detail::PickleWriter;
using stitch::detail::PyValue;
using stitch::formats::read_pickle;

namespace fs = std::filesystem;

// The object behind the CPython samples below:
// {'none': None, 't': True, 'f': False,
//  'ints': [0, 1, 255, 256, 65535, 65536, 2**31-1, 2**31, -1, -2**31, -2**31-1, 2**63-1, 2**63,
//           2**64-1, -2**63],
//  'float': 1.5, 'neg': -0.25, 'str': 'héllo € 😀', 'quote': 'it\'s "q" \\ \n',
//  'tuple': (1, 'a', (2,)), 'empty': ((), [], {}), 'nested': {'a': [{'b': 1}, {'b': 1}]}}

// pickle.dumps(kSample, protocol=0) by CPython 3.11
const std::string kSampleProto0(
      "\x28\x64\x70\x30\x0a\x56\x6e\x6f\x6e\x65\x0a\x70\x31\x0a\x4e\x73\x56\x74\x0a\x70\x32\x0a\x49\x30"
      "\x31\x0a\x73\x56\x66\x0a\x70\x33\x0a\x49\x30\x30\x0a\x73\x56\x69\x6e\x74\x73\x0a\x70\x34\x0a\x28"
      "\x6c\x70\x35\x0a\x49\x30\x0a\x61\x49\x31\x0a\x61\x49\x32\x35\x35\x0a\x61\x49\x32\x35\x36\x0a\x61"
      "\x49\x36\x35\x35\x33\x35\x0a\x61\x49\x36\x35\x35\x33\x36\x0a\x61\x49\x32\x31\x34\x37\x34\x38\x33"
      "\x36\x34\x37\x0a\x61\x4c\x32\x31\x34\x37\x34\x38\x33\x36\x34\x38\x4c\x0a\x61\x49\x2d\x31\x0a\x61"
      "\x49\x2d\x32\x31\x34\x37\x34\x38\x33\x36\x34\x38\x0a\x61\x4c\x2d\x32\x31\x34\x37\x34\x38\x33\x36"
      "\x34\x39\x4c\x0a\x61\x4c\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30"
      "\x37\x4c\x0a\x61\x4c\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30\x38"
      "\x4c\x0a\x61\x4c\x31\x38\x34\x34\x36\x37\x34\x34\x30\x37\x33\x37\x30\x39\x35\x35\x31\x36\x31\x35"
      "\x4c\x0a\x61\x4c\x2d\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30\x38"
      "\x4c\x0a\x61\x73\x56\x66\x6c\x6f\x61\x74\x0a\x70\x36\x0a\x46\x31\x2e\x35\x0a\x73\x56\x6e\x65\x67"
      "\x0a\x70\x37\x0a\x46\x2d\x30\x2e\x32\x35\x0a\x73\x56\x73\x74\x72\x0a\x70\x38\x0a\x56\x68\xe9\x6c"
      "\x6c\x6f\x20\x5c\x75\x32\x30\x61\x63\x20\x5c\x55\x30\x30\x30\x31\x66\x36\x30\x30\x0a\x70\x39\x0a"
      "\x73\x56\x71\x75\x6f\x74\x65\x0a\x70\x31\x30\x0a\x56\x69\x74\x27\x73\x20\x22\x71\x22\x20\x5c\x75"
      "\x30\x30\x35\x63\x20\x5c\x75\x30\x30\x30\x61\x0a\x70\x31\x31\x0a\x73\x56\x74\x75\x70\x6c\x65\x0a"
      "\x70\x31\x32\x0a\x28\x49\x31\x0a\x56\x61\x0a\x70\x31\x33\x0a\x28\x49\x32\x0a\x74\x70\x31\x34\x0a"
      "\x74\x70\x31\x35\x0a\x73\x56\x65\x6d\x70\x74\x79\x0a\x70\x31\x36\x0a\x28\x28\x74\x28\x6c\x70\x31"
      "\x37\x0a\x28\x64\x70\x31\x38\x0a\x74\x70\x31\x39\x0a\x73\x56\x6e\x65\x73\x74\x65\x64\x0a\x70\x32"
      "\x30\x0a\x28\x64\x70\x32\x31\x0a\x67\x31\x33\x0a\x28\x6c\x70\x32\x32\x0a\x28\x64\x70\x32\x33\x0a"
      "\x56\x62\x0a\x70\x32\x34\x0a\x49\x31\x0a\x73\x61\x28\x64\x70\x32\x35\x0a\x67\x32\x34\x0a\x49\x31"
      "\x0a\x73\x61\x73\x73\x2e"
    , 486);
// pickle.dumps(kSample, protocol=1) by CPython 3.11
const std::string kSampleProto1(
      "\x7d\x71\x00\x28\x58\x04\x00\x00\x00\x6e\x6f\x6e\x65\x71\x01\x4e\x58\x01\x00\x00\x00\x74\x71\x02"
      "\x49\x30\x31\x0a\x58\x01\x00\x00\x00\x66\x71\x03\x49\x30\x30\x0a\x58\x04\x00\x00\x00\x69\x6e\x74"
      "\x73\x71\x04\x5d\x71\x05\x28\x4b\x00\x4b\x01\x4b\xff\x4d\x00\x01\x4d\xff\xff\x4a\x00\x00\x01\x00"
      "\x4a\xff\xff\xff\x7f\x4c\x32\x31\x34\x37\x34\x38\x33\x36\x34\x38\x4c\x0a\x4a\xff\xff\xff\xff\x4a"
      "\x00\x00\x00\x80\x4c\x2d\x32\x31\x34\x37\x34\x38\x33\x36\x34\x39\x4c\x0a\x4c\x39\x32\x32\x33\x33"
      "\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30\x37\x4c\x0a\x4c\x39\x32\x32\x33\x33\x37\x32"
      "\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30\x38\x4c\x0a\x4c\x31\x38\x34\x34\x36\x37\x34\x34\x30"
      "\x37\x33\x37\x30\x39\x35\x35\x31\x36\x31\x35\x4c\x0a\x4c\x2d\x39\x32\x32\x33\x33\x37\x32\x30\x33"
      "\x36\x38\x35\x34\x37\x37\x35\x38\x30\x38\x4c\x0a\x65\x58\x05\x00\x00\x00\x66\x6c\x6f\x61\x74\x71"
      "\x06\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x58\x03\x00\x00\x00\x6e\x65\x67\x71\x07\x47\xbf\xd0\x00"
      "\x00\x00\x00\x00\x00\x58\x03\x00\x00\x00\x73\x74\x72\x71\x08\x58\x0f\x00\x00\x00\x68\xc3\xa9\x6c"
      "\x6c\x6f\x20\xe2\x82\xac\x20\xf0\x9f\x98\x80\x71\x09\x58\x05\x00\x00\x00\x71\x75\x6f\x74\x65\x71"
      "\x0a\x58\x0c\x00\x00\x00\x69\x74\x27\x73\x20\x22\x71\x22\x20\x5c\x20\x0a\x71\x0b\x58\x05\x00\x00"
      "\x00\x74\x75\x70\x6c\x65\x71\x0c\x28\x4b\x01\x58\x01\x00\x00\x00\x61\x71\x0d\x28\x4b\x02\x74\x71"
      "\x0e\x74\x71\x0f\x58\x05\x00\x00\x00\x65\x6d\x70\x74\x79\x71\x10\x28\x29\x5d\x71\x11\x7d\x71\x12"
      "\x74\x71\x13\x58\x06\x00\x00\x00\x6e\x65\x73\x74\x65\x64\x71\x14\x7d\x71\x15\x68\x0d\x5d\x71\x16"
      "\x28\x7d\x71\x17\x58\x01\x00\x00\x00\x62\x71\x18\x4b\x01\x73\x7d\x71\x19\x68\x18\x4b\x01\x73\x65"
      "\x73\x75\x2e"
    , 411);
// pickle.dumps(kSample, protocol=2) by CPython 3.11
const std::string kSampleProto2(
      "\x80\x02\x7d\x71\x00\x28\x58\x04\x00\x00\x00\x6e\x6f\x6e\x65\x71\x01\x4e\x58\x01\x00\x00\x00\x74"
      "\x71\x02\x88\x58\x01\x00\x00\x00\x66\x71\x03\x89\x58\x04\x00\x00\x00\x69\x6e\x74\x73\x71\x04\x5d"
      "\x71\x05\x28\x4b\x00\x4b\x01\x4b\xff\x4d\x00\x01\x4d\xff\xff\x4a\x00\x00\x01\x00\x4a\xff\xff\xff"
      "\x7f\x8a\x05\x00\x00\x00\x80\x00\x4a\xff\xff\xff\xff\x4a\x00\x00\x00\x80\x8a\x05\xff\xff\xff\x7f"
      "\xff\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x09"
      "\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x65\x58\x05\x00\x00"
      "\x00\x66\x6c\x6f\x61\x74\x71\x06\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x58\x03\x00\x00\x00\x6e\x65"
      "\x67\x71\x07\x47\xbf\xd0\x00\x00\x00\x00\x00\x00\x58\x03\x00\x00\x00\x73\x74\x72\x71\x08\x58\x0f"
      "\x00\x00\x00\x68\xc3\xa9\x6c\x6c\x6f\x20\xe2\x82\xac\x20\xf0\x9f\x98\x80\x71\x09\x58\x05\x00\x00"
      "\x00\x71\x75\x6f\x74\x65\x71\x0a\x58\x0c\x00\x00\x00\x69\x74\x27\x73\x20\x22\x71\x22\x20\x5c\x20"
      "\x0a\x71\x0b\x58\x05\x00\x00\x00\x74\x75\x70\x6c\x65\x71\x0c\x4b\x01\x58\x01\x00\x00\x00\x61\x71"
      "\x0d\x4b\x02\x85\x71\x0e\x87\x71\x0f\x58\x05\x00\x00\x00\x65\x6d\x70\x74\x79\x71\x10\x29\x5d\x71"
      "\x11\x7d\x71\x12\x87\x71\x13\x58\x06\x00\x00\x00\x6e\x65\x73\x74\x65\x64\x71\x14\x7d\x71\x15\x68"
      "\x0d\x5d\x71\x16\x28\x7d\x71\x17\x58\x01\x00\x00\x00\x62\x71\x18\x4b\x01\x73\x7d\x71\x19\x68\x18"
      "\x4b\x01\x73\x65\x73\x75\x2e"
    , 343);
// pickle.dumps(kSample, protocol=4) by CPython 3.11
const std::string kSampleProto4(
      "\x80\x04\x95\x0e\x01\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x04\x6e\x6f\x6e\x65\x94\x4e\x8c\x01"
      "\x74\x94\x88\x8c\x01\x66\x94\x89\x8c\x04\x69\x6e\x74\x73\x94\x5d\x94\x28\x4b\x00\x4b\x01\x4b\xff"
      "\x4d\x00\x01\x4d\xff\xff\x4a\x00\x00\x01\x00\x4a\xff\xff\xff\x7f\x8a\x05\x00\x00\x00\x80\x00\x4a"
      "\xff\xff\xff\xff\x4a\x00\x00\x00\x80\x8a\x05\xff\xff\xff\x7f\xff\x8a\x08\xff\xff\xff\xff\xff\xff"
      "\xff\x7f\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"
      "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x65\x8c\x05\x66\x6c\x6f\x61\x74\x94\x47\x3f\xf8\x00\x00"
      "\x00\x00\x00\x00\x8c\x03\x6e\x65\x67\x94\x47\xbf\xd0\x00\x00\x00\x00\x00\x00\x8c\x03\x73\x74\x72"
      "\x94\x8c\x0f\x68\xc3\xa9\x6c\x6c\x6f\x20\xe2\x82\xac\x20\xf0\x9f\x98\x80\x94\x8c\x05\x71\x75\x6f"
      "\x74\x65\x94\x8c\x0c\x69\x74\x27\x73\x20\x22\x71\x22\x20\x5c\x20\x0a\x94\x8c\x05\x74\x75\x70\x6c"
      "\x65\x94\x4b\x01\x8c\x01\x61\x94\x4b\x02\x85\x94\x87\x94\x8c\x05\x65\x6d\x70\x74\x79\x94\x29\x5d"
      "\x94\x7d\x94\x87\x94\x8c\x06\x6e\x65\x73\x74\x65\x64\x94\x7d\x94\x68\x0d\x5d\x94\x28\x7d\x94\x8c"
      "\x01\x62\x94\x4b\x01\x73\x7d\x94\x68\x18\x4b\x01\x73\x65\x73\x75\x2e"
    , 281);

// A string literal with embedded NULs, without its terminator.
template <std::size_t N>
std::string bin(const char (&s)[N]) {
  return std::string(s, N - 1);
}

PyValue S(const char* s) { return PyValue::string(s); }
PyValue I(std::int64_t v) { return PyValue::integer(v); }

PyValue sample_value() {
  PyValue::Items ints;
  for (std::int64_t v : {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{256},
                         std::int64_t{65535}, std::int64_t{65536}, std::int64_t{2147483647},
                         std::int64_t{2147483648}, std::int64_t{-1}, std::int64_t{-2147483648},
                         std::int64_t{-2147483649}, INT64_MAX})
    ints.push_back(I(v));
  ints.push_back(PyValue::unsigned_integer(std::uint64_t{1} << 63));
  ints.push_back(PyValue::unsigned_integer(UINT64_MAX));
  ints.push_back(I(INT64_MIN));
  PyValue b1 = PyValue::dict({{S("b"), I(1)}});
  PyValue b2 = PyValue::dict({{S("b"), I(1)}});
  return PyValue::dict({
      {S("none"), PyValue()},
      {S("t"), PyValue::boolean(true)},
      {S("f"), PyValue::boolean(false)},
      {S("ints"), PyValue::list(ints)},
      {S("float"), PyValue::floating(1.5)},
      {S("neg"), PyValue::floating(-0.25)},
      {S("str"), S("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80")},
      {S("quote"), S("it's \"q\" \\ \n")},
      {S("tuple"), PyValue::tuple({I(1), S("a"), PyValue::tuple({I(2)})})},
      {S("empty"), PyValue::tuple({PyValue::tuple(), PyValue::list(), PyValue::dict()})},
      {S("nested"), PyValue::dict({{S("a"), PyValue::list({b1, b2})}})},
  });
}

std::string with_protocol(std::string data, char proto) {
  data[1] = proto;
  return data;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The error message of read_pickle(data), or "" if it parsed.
std::string read_error(const std::string& data, const PickleLimits& limits = {}) {
  try {
    (void)read_pickle(data, "test.pickle", limits);
  } catch (const stitch::error& e) {
    return e.what();
  }
  return "";
}

fs::path traces_dir() {
  const char* env = std::getenv("STITCH_TRACES_DIR");
  return env != nullptr ? fs::path(env) : fs::path("/work/shared/traces");
}

std::vector<fs::path> real_traces() {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(traces_dir(), ec)) return out;
  for (const auto& e : fs::directory_iterator(traces_dir(), ec))
    if (e.path().extension() == ".pickle") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- CPython's pickles ------------------------------------------------------------------------

TEST(PickleReader, ReadsEveryProtocolAsCPythonWritesIt) {
  const PyValue expected = sample_value();
  const std::map<std::string, std::string> samples = {
      {"protocol 0", kSampleProto0},
      {"protocol 1", kSampleProto1},
      {"protocol 2", kSampleProto2},
      {"protocol 3", with_protocol(kSampleProto2, '\x03')},
      {"protocol 4", kSampleProto4},
      {"protocol 5", with_protocol(kSampleProto4, '\x05')},
  };
  for (const auto& [name, data] : samples) {
    SCOPED_TRACE(name);
    PyValue v;
    ASSERT_NO_THROW(v = read_pickle(data, name)) << read_error(data);
    EXPECT_TRUE(v == expected) << v.repr(2000);
  }
}

TEST(PickleReader, AccessorsAndTypes) {
  const PyValue v = read_pickle(kSampleProto4);
  ASSERT_TRUE(v.is_dict());
  const PyValue& ints = *v.get("ints");
  ASSERT_EQ(ints.size(), 15u);
  EXPECT_EQ(ints.items()[7].as_int(), 2147483648);
  EXPECT_FALSE(ints.items()[11].is_big());
  EXPECT_EQ(ints.items()[11].as_int(), INT64_MAX);
  EXPECT_TRUE(ints.items()[12].is_big());
  EXPECT_EQ(ints.items()[12].as_uint(), std::uint64_t{1} << 63);
  EXPECT_EQ(ints.items()[13].as_uint(), UINT64_MAX);
  EXPECT_EQ(ints.items()[14].as_int(), INT64_MIN);
  EXPECT_THROW((void)ints.items()[13].as_int(), stitch::error);
  EXPECT_THROW((void)ints.items()[8].as_uint(), stitch::error);
  EXPECT_EQ(v.get("str")->as_string(), "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_DOUBLE_EQ(v.get("neg")->as_float(), -0.25);
  EXPECT_TRUE(v.get("none")->is_none());
  EXPECT_TRUE(v.get("t")->as_bool());
  EXPECT_EQ(v.get("missing"), nullptr);
  EXPECT_THROW((void)v.get("str")->as_int(), stitch::error);
  EXPECT_TRUE(v.get("tuple")->is_tuple());
}

TEST(PickleReader, ReadsProtocol0StringsAndPython2Opcodes) {
  // STRING with escapes, SHORT_BINSTRING, BINSTRING, INT/LONG/FLOAT text forms, PUT/GET, DICT.
  const std::string data = bin(
      "(dp0\nS'a\\nb\\x41\\'c\\101'\np1\nU\x02hisT\x03\x00\x00\x00xyzI-7\nsL12345678901234567890L\n"
      "F2.5\nsU\x01kg1\ns.");
  PyValue v;
  ASSERT_NO_THROW(v = read_pickle(data)) << read_error(data);
  ASSERT_TRUE(v.is_dict()) << v.repr();
  ASSERT_EQ(v.entries().size(), 4u) << v.repr();
  EXPECT_EQ(v.entries()[0].first.as_string(), "a\nbA'cA");
  EXPECT_EQ(v.entries()[0].second.as_string(), "hi");
  EXPECT_EQ(v.entries()[1].first.as_string(), "xyz");
  EXPECT_EQ(v.entries()[1].second.as_int(), -7);
  EXPECT_EQ(v.entries()[2].first.as_uint(), 12345678901234567890u);
  EXPECT_DOUBLE_EQ(v.entries()[2].second.as_float(), 2.5);
  EXPECT_EQ(v.entries()[3].first.as_string(), "k");
  EXPECT_EQ(v.entries()[3].second.as_string(), "a\nbA'cA");  // GET of the memoized key
}

TEST(PickleReader, HandlesSparseMemoIndicesAsPythonDoes) {
  // BINPUT 5 then MEMOIZE (index len(memo) == 1): both name the same list. Checked with CPython.
  PyValue v = read_pickle(bin("\x80\x04]q\x05\x94" "0" "h\x01h\x05\x86."));
  EXPECT_TRUE(v == PyValue::tuple({PyValue::list(), PyValue::list()})) << v.repr();
  EXPECT_EQ(v.items()[0].node(), v.items()[1].node());  // one shared list
  v = read_pickle(bin("\x80\x04Nr\x70\x11\x01\x00\x94" "0" "j\x70\x11\x01\x00h\x01\x86."));
  EXPECT_TRUE(v == PyValue::tuple({PyValue(), PyValue()})) << v.repr();
}

// ---- the writer and round trips ---------------------------------------------------------------

TEST(PickleWriter, RoundTripsEveryPlainType) {
  PyValue big_list = PyValue::list();
  for (int i = 0; i < 2500; ++i) big_list.append(I(i * 7919 - 10000));  // several APPENDS batches
  PyValue big_dict = PyValue::dict();
  for (int i = 0; i < 1500; ++i) big_dict.set(S(("k" + std::to_string(i)).c_str()), I(i));
  PyValue v = sample_value();
  const PyValue long_text = PyValue::string(std::string(70000, 'x'));  // BINUNICODE across frames
  PyValue extra = PyValue::dict({
      {S("big_list"), big_list},
      {S("big_dict"), big_dict},
      {S("long"), long_text},
      {S("bytes"), PyValue::bytes(bin("\x00\xff\x80 bin"))},
      {S("tuple4"), PyValue::tuple({I(1), I(2), I(3), I(4)})},
      {I(5), S("int key")},
      {PyValue::tuple({I(0), I(0)}), S("tuple key")},
      {S("sample"), v},
  });
  PickleWriter w;
  w.value(extra);
  const std::string data = w.finish();
  ASSERT_EQ(static_cast<unsigned char>(data[0]), 0x80);
  ASSERT_EQ(data[1], '\x04');
  PyValue back;
  ASSERT_NO_THROW(back = read_pickle(data)) << read_error(data);
  EXPECT_TRUE(back == extra);
}

TEST(PickleWriter, IntegersUseCPythonsEncoding) {
  // Byte-for-byte what pickle.dumps(v, protocol=4) puts between the frame header and STOP.
  const std::pair<PyValue, std::string> cases[] = {
      {I(0), bin("K\x00")},
      {I(255), "K\xff"},
      {I(256), bin("M\x00\x01")},
      {I(65536), bin("J\x00\x00\x01\x00")},
      {I(-1), "J\xff\xff\xff\xff"},
      {I(2147483648), bin("\x8a\x05\x00\x00\x00\x80\x00")},
      {I(-2147483649), "\x8a\x05\xff\xff\xff\x7f\xff"},
      {I(INT64_MIN), bin("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80")},
      {PyValue::unsigned_integer(UINT64_MAX), bin("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00")},
      {PyValue::floating(1.5), bin("G\x3f\xf8\x00\x00\x00\x00\x00\x00")},
  };
  for (const auto& [v, body] : cases) {
    PickleWriter w;
    w.value(v);
    const std::string data = w.finish();
    EXPECT_EQ(data.substr(11, data.size() - 12), body) << v.repr();
    EXPECT_TRUE(read_pickle(data) == v) << v.repr();
  }
}

TEST(PickleReader, IntegersWiderThan64BitsAreKeptWhole) {
  // pickle.dumps(v, protocol=4)'s bodies, and protocol 0's text form of 2^64.
  const std::pair<std::string, std::string> cases[] = {
      {bin("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"), "18446744073709551616"},
      {bin("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xff"), "-18446744073709551616"},
      {bin("\x8a\x09\x01\x00\x00\x00\x00\x00\x00\x00\xc0"), "-1180591620717411303423"},
      {bin("\x8a\x1a") + std::string(25, '\0') + "\x01",
       "1606938044258990275541962092341162602522202993782792835301376"},
  };
  for (const auto& [body, decimal] : cases) {
    SCOPED_TRACE(decimal);
    const std::string data = bin("\x80\x04") + body + ".";
    PyValue v;
    ASSERT_NO_THROW(v = read_pickle(data)) << read_error(data);
    ASSERT_TRUE(v.is_int());
    EXPECT_TRUE(v.is_wide());
    EXPECT_EQ(v.decimal(), decimal);
    EXPECT_EQ(v.repr(), decimal);
    EXPECT_THROW((void)v.as_int(), stitch::error);
    EXPECT_THROW((void)v.as_uint(), stitch::error);
    // The writer gives CPython's bytes back.
    PickleWriter w;
    w.value(v);
    const std::string out = w.finish();
    EXPECT_EQ(out.substr(11, out.size() - 12), body);
    EXPECT_TRUE(read_pickle(out) == v);
  }
  const PyValue text = read_pickle("L18446744073709551616L\n.");
  EXPECT_EQ(text.decimal(), "18446744073709551616");
  EXPECT_TRUE(text == read_pickle(bin("\x80\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.")));
  // Where 64 bits do hold the value it stays a plain int, however it was written.
  const PyValue max = read_pickle(bin("\x80\x04\x8a\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00."));
  EXPECT_FALSE(max.is_wide());
  EXPECT_EQ(max.as_uint(), UINT64_MAX);
}

TEST(PickleReader, SkippedKeysAreReadAsNoneAndTheirListsFreed) {
  // {'frames': [1, 2, 3], 'size': 7, 'again': <the same list>} — the list is referenced twice.
  PyValue l = PyValue::list({I(1), I(2), I(3)});
  PyValue d = PyValue::dict({{S("frames"), l}, {S("size"), I(7)}});
  PickleWriter w;
  w.value(d);
  const std::string data = w.finish();
  PickleLimits limits;
  limits.skip_keys = {"frames"};
  const PyValue back = read_pickle(data, "skip.pickle", limits);
  ASSERT_NE(back.get("frames"), nullptr);
  EXPECT_TRUE(back.get("frames")->is_none());
  EXPECT_EQ(back.get("size")->as_int(), 7);
  EXPECT_TRUE(read_pickle(data) == d) << "without skip_keys nothing changes";
}

TEST(PickleWriter, ReplacesInvalidUtf8) {
  PickleWriter w;
  w.string("ok \xff\xfe end \xed\xa0\x80");
  const PyValue v = read_pickle(w.finish());
  EXPECT_EQ(v.as_string(), "ok \xef\xbf\xbd\xef\xbf\xbd end \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
}

// ---- hostile input ----------------------------------------------------------------------------

TEST(PickleReader, RejectsGlobalAndReduceWithOffsetAndOpcode) {
  // The classic: os.system('echo pwned') in protocol 0.
  const std::string p0 = "cos\nsystem\n(S'echo pwned'\ntR.";
  std::string err = read_error(p0);
  EXPECT_TRUE(contains(err, "test.pickle: offset 0:")) << err;
  EXPECT_TRUE(contains(err, "GLOBAL")) << err;
  EXPECT_TRUE(contains(err, "not allowed")) << err;

  // Protocol 4: STACK_GLOBAL at offset 16, then REDUCE.
  const std::string p4 = bin("\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x04\x65\x63ho\x94\x85\x94R\x94.");
  err = read_error(p4);
  EXPECT_TRUE(contains(err, "offset 16:")) << err;
  EXPECT_TRUE(contains(err, "STACK_GLOBAL (0x93)")) << err;

  // REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1, PERSID: each rejected where it stands.
  const std::pair<std::string, std::string> more[] = {
      {bin("\x80\x02N)R."), "offset 4: opcode REDUCE"},
      {bin("\x80\x02}}b."), "offset 4: opcode BUILD"},
      {"(i__main__\nX\n.", "offset 1: opcode INST"},
      {bin("\x80\x02(N)o."), "offset 5: opcode OBJ"},
      {bin("\x80\x02N)\x81."), "offset 4: opcode NEWOBJ"},
      {bin("\x80\x04N)}\x92."), "offset 5: opcode NEWOBJ_EX"},
      {bin("\x80\x02\x82\x01."), "offset 2: opcode EXT1"},
      {"Pid\n.", "offset 0: opcode PERSID"},
      {bin("\x80\x05\x97."), "offset 2: opcode NEXT_BUFFER"},
  };
  for (const auto& [data, want] : more) {
    err = read_error(data);
    EXPECT_TRUE(contains(err, want)) << "want '" << want << "', got: " << err;
  }
}

TEST(PickleReader, RejectsGlobalHiddenInsideASnapshot) {
  // A well-formed snapshot whose first block state is replaced by GLOBAL + REDUCE.
  stitch::Snapshot snap;
  stitch::SegmentSnapshot seg;
  seg.address = 0x1000;
  seg.total_size = 512;
  seg.segment_type = "small";
  seg.blocks.push_back({0x1000, 512, 0, "inactive"});
  snap.segments.push_back(seg);
  snap.device_traces.resize(1);
  std::string data = stitch::detail::snapshot_to_pickle(snap);
  const std::string state = "\x8c\x08inactive";
  const std::size_t at = data.find(state);
  ASSERT_NE(at, std::string::npos);
  data.replace(at, state.size(), "cos\nsystem\n)R");
  const std::string err = read_error(data);
  EXPECT_TRUE(contains(err, "offset " + std::to_string(at) + ": opcode GLOBAL")) << err;
}

TEST(PickleReader, RejectsEveryTruncation) {
  for (const std::string& data : {kSampleProto0, kSampleProto2, kSampleProto4}) {
    for (std::size_t n = 0; n < data.size(); ++n) {
      const std::string err = read_error(data.substr(0, n));
      ASSERT_TRUE(contains(err, "test.pickle: offset ")) << "prefix of " << n << " bytes: " << err;
    }
  }
  EXPECT_TRUE(contains(read_error(""), "offset 0: truncated")) << read_error("");
  // A declared length far beyond the data is refused before anything is allocated.
  const std::string huge = bin("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f" "abc.");
  const std::string err = read_error(huge);
  EXPECT_TRUE(contains(err, "offset 2: truncated: BINUNICODE8 needs 9223372036854775807 bytes")) << err;
  const std::string frame = bin("\x80\x04\x95\x00\x00\x00\x00\x01\x00\x00\x00N.");
  EXPECT_TRUE(contains(read_error(frame), "offset 2: truncated: FRAME announces")) << read_error(frame);
}

TEST(PickleReader, RejectsCorruptedStructure) {
  const std::pair<std::string, std::string> cases[] = {
      {bin("\x80\x04\xff."), "offset 2: unknown opcode 0xff"},
      {bin("\x80\x04h\x05."), "offset 2: bad memo index 5"},
      {bin("\x80\x04N\x94j\x07\x00\x00\x00."), "offset 4: bad memo index 7"},
      {bin("\x80\x04" "a."), "offset 2: APPEND needs a value"},
      {bin("\x80\x04N" "a."), "offset 3: APPEND needs a value"},
      {bin("\x80\x04NNa."), "offset 4: APPEND on a NoneType"},
      {bin("\x80\x04}(Nu."), "offset 5: SETITEMS with an odd number of items"},
      {bin("\x80\x04}]Ns."), "offset 5: unhashable dict key of type list"},
      {bin("\x80\x04N(."), "offset 4: STOP with an unclosed MARK"},
      {bin("\x80\x04NN."), "offset 4: STOP with 2 values"},
      {bin("\x80\x07N."), "offset 0: unsupported pickle protocol 7"},
      {"p123456789012345678901234567890\n.", "offset 0: PUT: memo index 123456789012345678901234567890 is out of range"},
      {"I" + std::string(4301, '7') + "\n.", "offset 0: INT: an integer of 4301 digits (at most 4300)"},
      {bin("\x80\x04\x8f."), "offset 2: opcode EMPTY_SET (0x8f): sets are not supported"},
      {"S'abc\n.", "offset 0: the STRING argument must be quoted"},
      {bin("\x80\x04u."), "offset 2: SETITEMS without a MARK"},
      {bin("\x80\x04(u."), "offset 3: SETITEMS has no dict below its MARK"},
      {"Np-1\n.", "offset 1: PUT: negative memo index -1"},
      {"g7\n.", "offset 0: bad memo index 7"},
  };
  for (const auto& [data, want] : cases) {
    const std::string err = read_error(data);
    EXPECT_TRUE(contains(err, "test.pickle: " + want)) << "want '" << want << "', got: " << err;
  }
}

TEST(PickleReader, RefusesReferenceCycles) {
  // l = []; l.append(l): EMPTY_LIST MEMOIZE BINGET 0 APPEND
  std::string err = read_error(bin("\x80\x04]\x94h\x00" "a."));
  EXPECT_TRUE(contains(err, "offset 6: APPEND modifies a container that is referenced more than once")) << err;
  // d = {}; d['d'] = d via SETITEMS
  err = read_error(bin("\x80\x04}\x94(\x8c\x01" "dh\x00u."));
  EXPECT_TRUE(contains(err, "offset 10: SETITEMS modifies a container")) << err;
  // DUP then APPEND
  err = read_error(bin("\x80\x04]2a."));
  EXPECT_TRUE(contains(err, "offset 4: APPEND modifies a container")) << err;
  // The builder API refuses cycles too.
  PyValue l = PyValue::list();
  EXPECT_THROW(l.append(l), stitch::error);
  PyValue outer = PyValue::list({l});
  EXPECT_THROW(l.append(outer), stitch::error);
}

TEST(PickleReader, BoundsNestingDepth) {
  std::string deep = "\x80\x04";
  for (int i = 0; i < 300; ++i) deep += ']';
  for (int i = 0; i < 299; ++i) deep += 'a';
  deep += '.';
  std::string err = read_error(deep);
  EXPECT_TRUE(contains(err, "nested deeper than 256 levels")) << err;
  PickleLimits loose;
  loose.max_depth = 400;
  EXPECT_EQ(read_error(deep, loose), "");
  // Depth built without a deep stack: wrap the previous list through the memo, 2000 times.
  std::string chain = "\x80\x04]";
  for (std::uint32_t i = 0; i < 2000; ++i) {
    chain += bin("\x94\x30]j");
    for (int k = 0; k < 4; ++k) chain += static_cast<char>((i >> (8 * k)) & 0xff);
    chain += 'a';
  }
  chain += '.';
  err = read_error(chain);
  EXPECT_TRUE(contains(err, "nested deeper than 256 levels")) << err;
}

TEST(PickleReader, BoundsMemory) {
  PickleWriter w;
  w.string(std::string(1 << 20, 'z'));
  const std::string data = w.finish();
  PickleLimits small;
  small.max_memory = 64 << 10;
  const std::string err = read_error(data, small);
  EXPECT_TRUE(contains(err, "max_memory")) << err;
  EXPECT_EQ(read_error(data), "");
  // Many small values: a MARK followed by a million NONEs within 1 MiB of input.
  std::string nones = bin("\x80\x04]") + "(" + std::string(1000000, 'N') + "e.";
  EXPECT_TRUE(contains(read_error(nones, small), "max_memory"));
}

TEST(PickleReader, SnapshotConversionBoundsSharedExpansion) {
  // One trace entry with 1000 frames, shared 100000 times: tiny as a pickle, ~10^8 strings if
  // materialized. The conversion must stop at the budget.
  PyValue frames = PyValue::list();
  for (int i = 0; i < 1000; ++i)
    frames.append(PyValue::dict({{S("name"), S("f")}, {S("filename"), S("x.py")}, {S("line"), I(i)}}));
  PyValue entry = PyValue::dict({{S("action"), S("alloc")}, {S("addr"), I(4096)}, {S("size"), I(512)},
                                 {S("stream"), I(0)}, {S("frames"), frames}});
  PyValue trace = PyValue::list();
  for (int i = 0; i < 100000; ++i) trace.append(entry);
  const PyValue root = PyValue::dict({{S("segments"), PyValue::list()},
                                      {S("device_traces"), PyValue::list({trace})}});
  stitch::formats::SnapshotReadOptions options;
  options.limits.max_memory = 16 << 20;
  try {
    (void)stitch::formats::snapshot_from_pyvalue(root, "bomb", options);
    FAIL() << "the expansion was not bounded";
  } catch (const stitch::error& e) {
    EXPECT_TRUE(contains(e.what(), "bomb: device_traces[0]")) << e.what();
    EXPECT_TRUE(contains(e.what(), "max_memory")) << e.what();
  }
}

TEST(PickleReader, SurvivesRandomCorruption) {
  stitch::Snapshot snap;
  stitch::SegmentSnapshot seg;
  seg.address = 0x7f0000000000;
  seg.total_size = 2 << 20;
  seg.segment_type = "small";
  seg.blocks.push_back({0x7f0000000000, 1024, 1000, "active_allocated"});
  seg.blocks.push_back({0x7f0000000400, (2 << 20) - 1024, 0, "inactive"});
  snap.segments.push_back(seg);
  snap.device_traces.push_back({{stitch::TraceAction::segment_alloc, 0x7f0000000000, 2 << 20, 0, 1, {"f (a.so)"}},
                                {stitch::TraceAction::alloc, 0x7f0000000000, 1000, 0, 2, {"g (b.so)", "f (a.so)"}}});
  snap.roundup_power2_divisions.assign(16, 0);
  const std::string inputs[] = {stitch::detail::snapshot_to_pickle(snap), kSampleProto0, kSampleProto4};
  std::mt19937 rng(12345);
  int parsed = 0;
  for (int iter = 0; iter < 4500; ++iter) {
    std::string bad = inputs[iter % 3];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng() & 0xff);
    if (rng() % 4 == 0) bad.resize(rng() % bad.size());
    try {
      const PyValue v = read_pickle(bad, "fuzz");
      (void)stitch::formats::snapshot_from_pyvalue(v, "fuzz");
      ++parsed;
    } catch (const stitch::error&) {
      // expected for most mutations
    }
  }
  SUCCEED() << parsed << " mutations still parsed";
}

// ---- real PyTorch snapshots -------------------------------------------------------------------

TEST(PickleReader, LoadsEveryRealPyTorchSnapshot) {
  const auto files = real_traces();
  if (files.empty()) GTEST_SKIP() << "no PyTorch snapshots in " << traces_dir();
  // Event counts from /work/shared/traces/README.md.
  const std::map<std::string, std::size_t> events = {
      {"cs336-ctx128-forward.pickle", 4657},      {"cs336-ctx128-forward-mixed.pickle", 5992},
      {"cs336-ctx128-fullstep.pickle", 19342},    {"cs336-ctx256-fullstep-warm.pickle", 20128},
      {"ftcourse-finetune.pickle", 10307},        {"a2-systems-bcrafton.pickle", 6486},
      {"eor-nn-small.pickle", 5803},
  };
  // Frames are the bulk of these files; the round-trip test below converts them for one file.
  stitch::formats::SnapshotReadOptions no_frames;
  no_frames.frames = false;
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.string());
    stitch::Snapshot snap;
    ASSERT_NO_THROW(snap = stitch::formats::read_snapshot_file(f.string(), no_frames));
    ASSERT_FALSE(snap.segments.empty());
    ASSERT_GE(snap.device_traces.size(), 1u);
    if (auto it = events.find(f.filename().string()); it != events.end())
      EXPECT_EQ(snap.device_traces[0].size(), it->second);
    for (const auto& s : snap.segments) {
      std::size_t sum = 0;
      std::uintptr_t next = s.address;
      for (const auto& b : s.blocks) {
        EXPECT_EQ(b.address, next);
        next += b.size;
        sum += b.size;
        EXPECT_TRUE(b.state == "active_allocated" || b.state == "inactive" || b.state == "active_pending_free")
            << b.state;
      }
      EXPECT_EQ(sum, s.total_size);
    }
  }
}

TEST(PickleReader, RealSnapshotsRoundTripThroughStitchsWriter) {
  const auto files = real_traces();
  if (files.empty()) GTEST_SKIP() << "no PyTorch snapshots in " << traces_dir();
  // The smallest file keeps the test fast; the others are covered by the loading test.
  const fs::path f = *std::min_element(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return fs::file_size(a) < fs::file_size(b);
  });
  const PyValue raw = stitch::formats::read_pickle_file(f.string());
  // Plain PyValue round trip: everything PyTorch wrote survives stitch's writer.
  PickleWriter w;
  w.value(raw);
  const PyValue again = read_pickle(w.finish());
  EXPECT_TRUE(again == raw);
  // Snapshot round trip.
  const stitch::Snapshot snap = stitch::formats::snapshot_from_pyvalue(raw, f.string());
  const stitch::Snapshot back = stitch::formats::snapshot_from_pyvalue(
      read_pickle(stitch::detail::snapshot_to_pickle(snap)), "rewritten");
  ASSERT_EQ(back.segments.size(), snap.segments.size());
  for (std::size_t i = 0; i < snap.segments.size(); ++i) {
    ASSERT_EQ(back.segments[i].blocks.size(), snap.segments[i].blocks.size());
    EXPECT_EQ(back.segments[i].address, snap.segments[i].address);
    EXPECT_EQ(back.segments[i].total_size, snap.segments[i].total_size);
  }
  ASSERT_EQ(back.device_traces.size(), snap.device_traces.size());
  for (std::size_t d = 0; d < snap.device_traces.size(); ++d) {
    ASSERT_EQ(back.device_traces[d].size(), snap.device_traces[d].size());
    for (std::size_t i = 0; i < snap.device_traces[d].size(); ++i) {
      const auto& a = snap.device_traces[d][i];
      const auto& b = back.device_traces[d][i];
      ASSERT_TRUE(a.action == b.action && a.addr == b.addr && a.size == b.size && a.stream == b.stream &&
                  a.time_us == b.time_us && a.frames == b.frames)
          << "entry " << i;
    }
  }
  EXPECT_EQ(back.settings, snap.settings);
  EXPECT_EQ(back.max_split_size, snap.max_split_size);
  EXPECT_EQ(back.roundup_power2_divisions, snap.roundup_power2_divisions);
}

}  // namespace
