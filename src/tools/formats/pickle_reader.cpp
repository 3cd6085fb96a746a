// tools/formats/pickle_reader.cpp — the safe pickle interpreter and the snapshot conversion. See
// pickle_reader.hpp for the guarantees.
#include "tools/formats/pickle_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <unordered_map>

#include "stitch/errors.hpp"

namespace stitch::formats {

// ---- the pickle interpreter ---------------------------------------------------------------------

namespace {

const char* opcode_name(std::uint8_t op) noexcept {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string describe_opcode(std::uint8_t op) {
  const char* name = opcode_name(op);
  const bool printable = op >= 0x20 && op < 0x7f;
  if (name == nullptr)
    return printable ? fmt::format("unknown opcode 0x{:02x} '{}'", op, static_cast<char>(op))
                     : fmt::format("unknown opcode 0x{:02x}", op);
  return printable ? fmt::format("{} (0x{:02x} '{}')", name, op, static_cast<char>(op))
                   : fmt::format("{} (0x{:02x})", name, op);
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr std::size_t kValueCost = sizeof(PyValue);
constexpr std::size_t kNodeCost = sizeof(PyValue::Node) + 32;  // plus the shared_ptr control block

class Interpreter {
 public:
  Interpreter(std::string_view data, std::string_view name, const PickleLimits& limits)
      : data_(data), name_(name), limits_(limits) {
    max_depth_ = std::min<std::size_t>(limits_.max_depth, PyValue::kMaxDepth);
  }

  PyValue run() {
    while (true) {
      op_ = pos_;
      if (pos_ >= data_.size()) fail("truncated: the data ends before STOP");
      const auto op = static_cast<std::uint8_t>(data_[pos_++]);
      if (step(op)) break;
    }
    if (!marks_.empty()) fail("STOP with an unclosed MARK");
    if (stack_.size() != 1)
      fail(fmt::format("STOP with {} values on the stack (expected exactly 1)", stack_.size()));
    PyValue result = std::move(stack_.back());
    stack_.clear();
    memo_.clear();
    sparse_memo_.clear();
    return result;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw error(fmt::format("{}: offset {}: {}", name_, op_, message));
  }

  void charge(std::size_t bytes) {
    used_ += bytes;
    if (used_ > limits_.max_memory)
      fail(fmt::format("the pickle needs more than {} bytes of memory (PickleLimits::max_memory)",
                       limits_.max_memory));
  }

  const char* take(std::uint64_t n, const char* what) {
    if (n > data_.size() - pos_)
      fail(fmt::format("truncated: {} needs {} bytes, {} left", what, n, data_.size() - pos_));
    const char* p = data_.data() + pos_;
    pos_ += static_cast<std::size_t>(n);
    return p;
  }
  std::uint64_t le(std::size_t n, const char* what) {
    const auto* p = reinterpret_cast<const unsigned char*>(take(n, what));
    std::uint64_t v = 0;
    for (std::size_t i = n; i > 0; --i) v = (v << 8) | p[i - 1];
    return v;
  }
  std::string_view line(const char* what) {
    const std::size_t nl = data_.find('\n', pos_);
    if (nl == std::string_view::npos) fail(fmt::format("truncated: {} has no terminating newline", what));
    std::string_view l = data_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    return l;
  }

  // Values above the innermost MARK.
  std::size_t top_count() const noexcept {
    return stack_.size() - (marks_.empty() ? 0 : marks_.back());
  }
  void push(PyValue v) {
    charge(kValueCost);
    stack_.push_back(std::move(v));
  }
  PyValue pop(const char* what) {
    if (top_count() == 0) fail(fmt::format("{} needs a value but the stack is empty", what));
    PyValue v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  PyValue& top(const char* what) {
    if (top_count() == 0) fail(fmt::format("{} needs a value but the stack is empty", what));
    return stack_.back();
  }
  std::size_t pop_mark(const char* what) {
    if (marks_.empty()) fail(fmt::format("{} without a MARK", what));
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }

  // A string or bytes opcode: a little-endian length of `width` bytes, then the data.
  void push_counted(std::size_t width, const char* what, bool bytes) {
    const auto n = le(width, what);
    push(make_string(take(n, what), n, bytes));
  }
  PyValue make_string(const char* p, std::size_t n, bool bytes) {
    charge(kNodeCost + n);
    return bytes ? PyValue::bytes(std::string(p, n)) : PyValue::string(std::string(p, n));
  }
  PyValue make_container(PyValue::Type type) {
    charge(kNodeCost);
    switch (type) {
      case PyValue::Type::list: return PyValue::list();
      case PyValue::Type::tuple: return PyValue::tuple();
      default: return PyValue::dict();
    }
  }

  // Records that `child` now lives inside `parent` (depth bookkeeping).
  void adopt(PyValue::Node* parent, const PyValue& child) {
    const std::uint32_t h = child.height() + 1;
    if (h > max_depth_) fail(fmt::format("containers nested deeper than {} levels", max_depth_));
    parent->height = std::max(parent->height, h);
  }
  PyValue::Node* mutable_target(PyValue& target, PyValue::Type type, const char* what) {
    if (target.type() != type)
      fail(fmt::format("{} on a {} (expected a {})", what, target.type_name(),
                       type == PyValue::Type::list ? "list" : "dict"));
    PyValue::Node* n = target.node();
    if (n->shared)
      fail(fmt::format("{} modifies a container that is referenced more than once (a possible "
                       "reference cycle; plain-data pickles never do this)", what));
    return n;
  }
  void add_entry(PyValue::Node* d, PyValue k, PyValue v) {
    if (!k.hashable()) fail(fmt::format("unhashable dict key of type {}", k.type_name()));
    if (!limits_.skip_keys.empty() && k.is_string() &&
        std::find(limits_.skip_keys.begin(), limits_.skip_keys.end(), k.as_string()) != limits_.skip_keys.end()) {
      if ((v.is_list() || v.is_tuple()) && !v.node()->shared) {
        const std::size_t freed = v.node()->items.size() * kValueCost;
        PyValue::Items().swap(v.node()->items);
        used_ = used_ > freed ? used_ - freed : 0;
      }
      v = PyValue();
    }
    adopt(d, k);
    adopt(d, v);
    charge(2 * kValueCost);
    d->entries.emplace_back(std::move(k), std::move(v));
  }
  void add_item(PyValue::Node* l, PyValue v) {
    adopt(l, v);
    charge(kValueCost);
    l->items.push_back(std::move(v));
  }
  PyValue build_tuple(std::size_t from) {
    PyValue t = make_container(PyValue::Type::tuple);
    PyValue::Node* n = t.node();
    n->height = 1;
    for (std::size_t i = from; i < stack_.size(); ++i) add_item(n, std::move(stack_[i]));
    stack_.resize(from);
    return t;
  }

  // The memo: dense indices (MEMOIZE, and BINPUT as Python's pickler numbers them) in a vector,
  // any others in a map whose keys stay >= the vector's size.
  std::size_t memo_size() const noexcept { return memo_.size() + sparse_memo_.size(); }
  void memo_put(std::uint64_t index) {
    PyValue& v = top("memo put");
    charge(kValueCost + 32);
    if (index < memo_.size()) {
      memo_[index] = v;
    } else if (index == memo_.size()) {
      memo_.push_back(v);
      sparse_memo_.erase(index);
    } else {
      sparse_memo_[index] = v;
    }
  }
  void memo_get(std::uint64_t index) {
    PyValue* v = nullptr;
    if (index < memo_.size()) {
      v = &memo_[index];
    } else if (auto it = sparse_memo_.find(index); it != sparse_memo_.end()) {
      v = &it->second;
    } else {
      fail(fmt::format("bad memo index {} (the memo has {} entries)", index, memo_size()));
    }
    if (v->is_container()) v->node()->shared = true;
    push(*v);
  }

  // Ints of any size: metadata (a frame's line, a time, an id) may be wider than 64 bits; only
  // the snapshot conversion decides where a value must fit (sizes and addresses).
  PyValue make_long(const unsigned char* p, std::size_t n) {
    if (n > 8) charge(kNodeCost + n);
    return PyValue::long_integer(std::string_view(reinterpret_cast<const char*>(p), n));
  }

  PyValue parse_decimal(std::string_view s, const char* what) {
    if (!s.empty() && s.back() == 'L') s.remove_suffix(1);  // protocol 0 LONG
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    const bool negative = !s.empty() && s.front() == '-';
    if (negative) s.remove_prefix(1);
    if (s.empty()) fail(fmt::format("{}: empty number", what));
    // Python itself refuses to convert longer digit strings (sys.int_info.default_max_str_digits):
    // the conversion is quadratic.
    if (s.size() > 4300) fail(fmt::format("{}: an integer of {} digits (at most 4300)", what, s.size()));
    // Little-endian magnitude bytes, times ten plus each digit.
    std::string mag;
    for (char c : s) {
      if (c < '0' || c > '9') fail(fmt::format("{}: '{}' is not an integer", what, s));
      unsigned carry = static_cast<unsigned>(c - '0');
      for (char& b : mag) {
        const unsigned cur = static_cast<unsigned char>(b) * 10u + carry;
        b = static_cast<char>(cur & 0xff);
        carry = cur >> 8;
      }
      if (carry != 0) mag.push_back(static_cast<char>(carry));
    }
    mag.push_back('\0');  // a sign byte: the magnitude is non-negative
    if (negative) {  // two's complement: invert and add one
      for (char& b : mag) b = static_cast<char>(~static_cast<unsigned char>(b));
      for (char& b : mag)
        if (static_cast<unsigned char>(++b) != 0) break;
    }
    if (mag.size() > 8) charge(kNodeCost + mag.size());
    return PyValue::long_integer(mag);
  }

  std::uint64_t memo_index(std::string_view text, const char* what) {
    const PyValue v = parse_decimal(text, what);
    if (v.is_wide()) fail(fmt::format("{}: memo index {} is out of range", what, v.decimal()));
    if (!v.is_big() && v.as_int() < 0) fail(fmt::format("{}: negative memo index {}", what, v.as_int()));
    return v.as_uint();
  }


  // Python's escape_decode, for protocol 0 STRING arguments.
  std::string unescape_string(std::string_view s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (c != '\\' || i + 1 == s.size()) {
        out += c;
        continue;
      }
      const char e = s[++i];
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': {
          const int h1 = i + 1 < s.size() ? hex_digit(s[i + 1]) : -1;
          const int h2 = i + 2 < s.size() ? hex_digit(s[i + 2]) : -1;
          if (h1 < 0 || h2 < 0) fail("STRING: invalid \\x escape");
          out += static_cast<char>(h1 * 16 + h2);
          i += 2;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
              v = v * 8 + (s[++i] - '0');
            out += static_cast<char>(v & 0xff);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  // Python's raw-unicode-escape decoding, for protocol 0 UNICODE arguments.
  std::string decode_raw_unicode(std::string_view s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '\\' && i + 1 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
        const std::size_t digits = s[i + 1] == 'u' ? 4 : 8;
        if (i + 2 + digits > s.size()) fail("UNICODE: truncated \\u escape");
        std::uint32_t cp = 0;
        for (std::size_t k = 0; k < digits; ++k) {
          const int h = hex_digit(s[i + 2 + k]);
          if (h < 0) fail("UNICODE: invalid \\u escape");
          cp = cp * 16 + static_cast<std::uint32_t>(h);
        }
        if (cp > 0x10ffff) fail("UNICODE: code point out of range");
        append_utf8(out, cp);
        i += 1 + digits;
      } else {
        append_utf8(out, c);  // latin-1
      }
    }
    return out;
  }

  [[noreturn]] void reject(std::uint8_t op) const {
    fail(fmt::format("opcode {} is not allowed: stitch reads plain data only and never imports, "
                     "constructs or calls anything", describe_opcode(op)));
  }

  // Executes one opcode; true at STOP.
  bool step(std::uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto v = le(1, "PROTO");
        if (v > 5) fail(fmt::format("unsupported pickle protocol {}", v));
        return false;
      }
      case 0x95: {  // FRAME: the data is already in memory; only check the length
        const auto n = le(8, "FRAME");
        if (n > data_.size() - pos_)
          fail(fmt::format("truncated: FRAME announces {} bytes, {} left", n, data_.size() - pos_));
        return false;
      }
      case '.': return true;  // STOP
      case '(':              // MARK
        charge(sizeof(std::size_t));
        marks_.push_back(stack_.size());
        return false;
      case '0':  // POP
        if (top_count() > 0) {
          stack_.pop_back();
        } else if (!marks_.empty()) {
          marks_.pop_back();
        } else {
          fail("POP on an empty stack");
        }
        return false;
      case '1':  // POP_MARK
        stack_.resize(pop_mark("POP_MARK"));
        return false;
      case '2': {  // DUP
        PyValue v = top("DUP");
        if (v.is_container()) v.node()->shared = true;
        push(std::move(v));
        return false;
      }
      case 'N': push(PyValue()); return false;
      case 0x88: push(PyValue::boolean(true)); return false;
      case 0x89: push(PyValue::boolean(false)); return false;

      // ---- numbers ----
      case 'J': push(PyValue::integer(static_cast<std::int32_t>(le(4, "BININT")))); return false;
      case 'K': push(PyValue::integer(static_cast<std::int64_t>(le(1, "BININT1")))); return false;
      case 'M': push(PyValue::integer(static_cast<std::int64_t>(le(2, "BININT2")))); return false;
      case 0x8a: {  // LONG1
        const auto n = le(1, "LONG1");
        push(make_long(reinterpret_cast<const unsigned char*>(take(n, "LONG1")), n));
        return false;
      }
      case 0x8b: {  // LONG4
        const auto n = static_cast<std::int32_t>(le(4, "LONG4"));
        if (n < 0) fail("LONG4 with a negative length");
        push(make_long(reinterpret_cast<const unsigned char*>(take(static_cast<std::uint64_t>(n), "LONG4")),
                       static_cast<std::size_t>(n)));
        return false;
      }
      case 'I': {  // INT (protocol 0); "01"/"00" are True/False
        const std::string_view l = line("INT");
        if (l == "01") push(PyValue::boolean(true));
        else if (l == "00") push(PyValue::boolean(false));
        else push(parse_decimal(l, "INT"));
        return false;
      }
      case 'L': push(parse_decimal(line("LONG"), "LONG")); return false;
      case 'G': {  // BINFLOAT, big-endian
        const auto* p = reinterpret_cast<const unsigned char*>(take(8, "BINFLOAT"));
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
        push(PyValue::floating(std::bit_cast<double>(bits)));
        return false;
      }
      case 'F': {  // FLOAT (protocol 0)
        const std::string_view l = line("FLOAT");
        double v = 0;
        auto [p, ec] = std::from_chars(l.data(), l.data() + l.size(), v);
        if (ec != std::errc() || p != l.data() + l.size()) fail(fmt::format("FLOAT: '{}' is not a number", l));
        push(PyValue::floating(v));
        return false;
      }

      // ---- strings and bytes ----
      case 0x8c:  // SHORT_BINUNICODE
        push_counted(1, "SHORT_BINUNICODE", false);
        return false;
      case 'X':  // BINUNICODE
        push_counted(4, "BINUNICODE", false);
        return false;
      case 0x8d:  // BINUNICODE8
        push_counted(8, "BINUNICODE8", false);
        return false;
      case 'U':  // SHORT_BINSTRING: Python 3 decodes it to str
        push_counted(1, "SHORT_BINSTRING", false);
        return false;
      case 'T': {
        const auto n = static_cast<std::int32_t>(le(4, "BINSTRING"));
        if (n < 0) fail("BINSTRING with a negative length");
        push(make_string(take(static_cast<std::uint64_t>(n), "BINSTRING"), static_cast<std::size_t>(n), false));
        return false;
      }
      case 'C':  // SHORT_BINBYTES
        push_counted(1, "SHORT_BINBYTES", true);
        return false;
      case 'B':  // BINBYTES
        push_counted(4, "BINBYTES", true);
        return false;
      case 0x8e:  // BINBYTES8
        push_counted(8, "BINBYTES8", true);
        return false;
      case 0x96:  // BYTEARRAY8: plain bytes for our purposes
        push_counted(8, "BYTEARRAY8", true);
        return false;
      case 'S': {  // STRING (protocol 0): a quoted Python 2 str literal
        std::string_view l = line("STRING");
        if (l.size() < 2 || l.front() != l.back() || (l.front() != '\'' && l.front() != '"'))
          fail("the STRING argument must be quoted");
        const std::string s = unescape_string(l.substr(1, l.size() - 2));
        push(make_string(s.data(), s.size(), false));
        return false;
      }
      case 'V': {  // UNICODE (protocol 0): raw-unicode-escape
        const std::string s = decode_raw_unicode(line("UNICODE"));
        push(make_string(s.data(), s.size(), false));
        return false;
      }

      // ---- containers ----
      case ']': push(make_container(PyValue::Type::list)); stack_.back().node()->height = 1; return false;
      case '}': push(make_container(PyValue::Type::dict)); stack_.back().node()->height = 1; return false;
      case ')': push(make_container(PyValue::Type::tuple)); stack_.back().node()->height = 1; return false;
      case 'l': {  // LIST
        const std::size_t m = pop_mark("LIST");
        PyValue l = make_container(PyValue::Type::list);
        l.node()->height = 1;
        for (std::size_t i = m; i < stack_.size(); ++i) add_item(l.node(), std::move(stack_[i]));
        stack_.resize(m);
        push(std::move(l));
        return false;
      }
      case 't': {  // TUPLE
        const std::size_t m = pop_mark("TUPLE");
        push(build_tuple(m));
        return false;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const std::size_t n = op - 0x84u;
        if (top_count() < n) fail(fmt::format("{} needs {} values on the stack", opcode_name(op), n));
        push(build_tuple(stack_.size() - n));
        return false;
      }
      case 'd': {  // DICT
        const std::size_t m = pop_mark("DICT");
        if ((stack_.size() - m) % 2 != 0) fail("DICT with an odd number of items");
        PyValue d = make_container(PyValue::Type::dict);
        d.node()->height = 1;
        for (std::size_t i = m; i < stack_.size(); i += 2)
          add_entry(d.node(), std::move(stack_[i]), std::move(stack_[i + 1]));
        stack_.resize(m);
        push(std::move(d));
        return false;
      }
      case 'a': {  // APPEND
        PyValue v = pop("APPEND");
        PyValue::Node* l = mutable_target(top("APPEND"), PyValue::Type::list, "APPEND");
        add_item(l, std::move(v));
        return false;
      }
      case 'e': {  // APPENDS
        const std::size_t m = pop_mark("APPENDS");
        if (m == 0 || (!marks_.empty() && marks_.back() == m))
          fail("APPENDS has no list below its MARK");
        PyValue::Node* l = mutable_target(stack_[m - 1], PyValue::Type::list, "APPENDS");
        for (std::size_t i = m; i < stack_.size(); ++i) add_item(l, std::move(stack_[i]));
        stack_.resize(m);
        return false;
      }
      case 's': {  // SETITEM
        PyValue v = pop("SETITEM");
        PyValue k = pop("SETITEM");
        PyValue::Node* d = mutable_target(top("SETITEM"), PyValue::Type::dict, "SETITEM");
        add_entry(d, std::move(k), std::move(v));
        return false;
      }
      case 'u': {  // SETITEMS
        const std::size_t m = pop_mark("SETITEMS");
        if (m == 0 || (!marks_.empty() && marks_.back() == m))
          fail("SETITEMS has no dict below its MARK");
        if ((stack_.size() - m) % 2 != 0) fail("SETITEMS with an odd number of items");
        PyValue::Node* d = mutable_target(stack_[m - 1], PyValue::Type::dict, "SETITEMS");
        for (std::size_t i = m; i < stack_.size(); i += 2)
          add_entry(d, std::move(stack_[i]), std::move(stack_[i + 1]));
        stack_.resize(m);
        return false;
      }

      // ---- memo ----
      case 0x94: memo_put(memo_size()); return false;  // MEMOIZE: memo[len(memo)]
      case 'q': memo_put(le(1, "BINPUT")); return false;
      case 'r': memo_put(le(4, "LONG_BINPUT")); return false;
      case 'p': memo_put(memo_index(line("PUT"), "PUT")); return false;
      case 'h': memo_get(le(1, "BINGET")); return false;
      case 'j': memo_get(le(4, "LONG_BINGET")); return false;
      case 'g': memo_get(memo_index(line("GET"), "GET")); return false;

      // ---- sets: plain data, but not part of the model ----
      case 0x8f:
      case 0x90:
      case 0x91:
        fail(fmt::format("opcode {}: sets are not supported", describe_opcode(op)));

      // ---- everything that imports or calls: never ----
      case 'c':    // GLOBAL
      case 0x93:   // STACK_GLOBAL
      case 'R':    // REDUCE
      case 'b':    // BUILD
      case 'i':    // INST
      case 'o':    // OBJ
      case 0x81:   // NEWOBJ
      case 0x92:   // NEWOBJ_EX
      case 0x82:   // EXT1
      case 0x83:   // EXT2
      case 0x84:   // EXT4
      case 'P':    // PERSID
      case 'Q':    // BINPERSID
      case 0x97:   // NEXT_BUFFER
      case 0x98:   // READONLY_BUFFER
        reject(op);
      default:
        fail(describe_opcode(op));
    }
  }

  std::string_view data_;
  std::string_view name_;
  PickleLimits limits_;
  std::size_t max_depth_ = 256;
  std::size_t pos_ = 0;
  std::size_t op_ = 0;
  std::size_t used_ = 0;
  std::vector<PyValue> stack_;
  std::vector<std::size_t> marks_;
  std::vector<PyValue> memo_;
  std::unordered_map<std::uint64_t, PyValue> sparse_memo_;
};

std::string read_file(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  const std::streamoff size = in.tellg();
  if (size < 0) throw error(fmt::format("{}: cannot determine the size", path));
  if (static_cast<std::uint64_t>(size) > max_bytes)
    throw error(fmt::format("{}: {} bytes is more than the limit of {} bytes (PickleLimits::max_memory)",
                            path, size, max_bytes));
  std::string data(static_cast<std::size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(data.data(), size)) throw error(fmt::format("{}: read failed", path));
  return data;
}

}  // namespace

PyValue read_pickle(std::string_view data, std::string_view name, const PickleLimits& limits) {
  return Interpreter(data, name, limits).run();
}

PyValue read_pickle_file(const std::string& path, const PickleLimits& limits) {
  const std::string data = read_file(path, limits.max_memory);
  PickleLimits rest = limits;
  rest.max_memory = limits.max_memory - data.size();
  return read_pickle(data, path, rest);
}

// ---- snapshot conversion ------------------------------------------------------------------------

bool parse_trace_action(std::string_view name, TraceAction* out) noexcept {
  static constexpr std::pair<std::string_view, TraceAction> kActions[] = {
      {"alloc", TraceAction::alloc},
      {"free_requested", TraceAction::free_requested},
      {"free_completed", TraceAction::free_completed},
      {"segment_alloc", TraceAction::segment_alloc},
      {"segment_free", TraceAction::segment_free},
      {"segment_map", TraceAction::segment_map},
      {"segment_unmap", TraceAction::segment_unmap},
      {"oom", TraceAction::oom},
      {"snapshot", TraceAction::snapshot},
  };
  for (const auto& [n, a] : kActions) {
    if (n == name) {
      *out = a;
      return true;
    }
  }
  return false;
}

namespace {

// Where a value sits in the snapshot ("segments[2].blocks[0].size"), built only for messages.
struct Path {
  const Path* parent = nullptr;
  std::string_view key;    ///< a dict key, or
  std::size_t index = 0;   ///< a list index when key is empty
  [[nodiscard]] Path operator[](std::size_t i) const { return Path{this, {}, i}; }
  [[nodiscard]] Path operator/(std::string_view k) const { return Path{this, k, 0}; }
  [[nodiscard]] std::string str() const {
    if (parent == nullptr) return key.empty() ? std::string("top level") : std::string(key);
    std::string out = parent->parent == nullptr && parent->key.empty() ? std::string() : parent->str();
    if (!key.empty()) return out.empty() ? std::string(key) : out + "." + std::string(key);
    return out + "[" + std::to_string(index) + "]";
  }
};

class Converter {
 public:
  Converter(std::string_view name, const SnapshotReadOptions& options)
      : name_(name), strict_(options.strict), frames_(options.frames), budget_(options.limits.max_memory) {}

  Snapshot run(const PyValue& root) {
    Snapshot snap;
    const Path top;
    const Path segments_path = top / "segments";
    const PyValue* segments = &root;
    if (root.is_dict()) {
      segments = &required(root, "segments", top);
      if (const PyValue* traces = root.get("device_traces")) read_traces(*traces, snap, top / "device_traces");
      if (const PyValue* settings = root.get("allocator_settings"); settings && !settings->is_none())
        read_settings(*settings, snap, top / "allocator_settings");
      if (const PyValue* meta = root.get("stitch"); meta != nullptr && meta->is_dict()) {
        const PyValue* version = meta->get("version");
        const PyValue* config = meta->get("config");
        snap.stitch_version = version != nullptr && version->is_string() ? version->as_string() : "?";
        if (config != nullptr && config->is_string()) snap.stitch_config = config->as_string();
      }
    }
    const auto& segs = list(*segments, segments_path);
    snap.segments.reserve(segs.size());
    for (std::size_t i = 0; i < segs.size(); ++i) snap.segments.push_back(read_segment(segs[i], segments_path[i]));
    return snap;
  }

 private:
  [[noreturn]] void fail(const Path& path, const std::string& message) const {
    throw error(fmt::format("{}: {}: {}", name_, path.str(), message));
  }
  void charge(std::size_t bytes, const Path& path) {
    used_ += bytes;
    if (used_ > budget_)
      fail(path, fmt::format("the snapshot expands to more than {} bytes (PickleLimits::max_memory)", budget_));
  }
  const PyValue& required(const PyValue& dict, std::string_view key, const Path& path) const {
    if (!dict.is_dict()) fail(path, fmt::format("expected dict, got {}", dict.type_name()));
    const PyValue* v = dict.get(key);
    if (v == nullptr) fail(path, fmt::format("missing key '{}'", key));
    return *v;
  }
  const PyValue::Items& list(const PyValue& v, const Path& path) const {
    if (!v.is_list() && !v.is_tuple()) fail(path, fmt::format("expected list, got {}", v.type_name()));
    return v.items();
  }
  // Sizes and addresses must fit in 64 bits; metadata (lines, times, ids) may be any int.
  std::uint64_t u64(const PyValue& v, const Path& path) const {
    if (!v.is_int()) fail(path, fmt::format("expected int, got {}", v.type_name()));
    if (v.is_wide()) fail(path, fmt::format("int {} does not fit in 64 bits", v.decimal()));
    return v.is_big() ? v.as_uint() : static_cast<std::uint64_t>(v.as_int());
  }
  /// Metadata: the value when it fits in int64, else `otherwise` (PyTorch writes an unknown line
  /// as 2^64 - 1).
  std::int64_t meta_i64(const PyValue& v, const Path& path, std::int64_t otherwise) const {
    if (!v.is_int()) fail(path, fmt::format("expected int, got {}", v.type_name()));
    return v.is_big() || v.is_wide() ? otherwise : v.as_int();
  }
  /// An id (a stream): its low 64 bits, whatever its size.
  std::uint64_t id_u64(const PyValue& v, const Path& path) const {
    if (!v.is_int()) fail(path, fmt::format("expected int, got {}", v.type_name()));
    if (v.is_wide()) return v.low_bits();
    return v.is_big() ? v.as_uint() : static_cast<std::uint64_t>(v.as_int());
  }
  double number(const PyValue& v, const Path& path) const {
    if (!v.is_float() && !v.is_int()) fail(path, fmt::format("expected float, got {}", v.type_name()));
    return v.as_float();
  }
  std::size_t size_field(const PyValue& dict, std::string_view key, const Path& path, bool need) const {
    const PyValue* v = dict.get(key);
    if (v == nullptr) {
      if (need) fail(path, fmt::format("missing key '{}'", key));
      return 0;
    }
    if (!v->is_int()) fail(path / key, fmt::format("expected int, got {}", v->type_name()));
    if (v->is_wide()) fail(path / key, fmt::format("int {} does not fit in 64 bits", v->decimal()));
    if (!v->is_big() && v->as_int() < 0)
      fail(path / key, fmt::format("expected a non-negative int, got {}", v->as_int()));
    return static_cast<std::size_t>(v->as_uint());
  }
  std::uint64_t u64_field(const PyValue& dict, std::string_view key, const Path& path) const {
    const PyValue* v = dict.get(key);
    return v == nullptr || v->is_none() ? 0 : u64(*v, path / key);
  }
  const std::string& str(const PyValue& v, const Path& path) const {
    if (!v.is_string()) fail(path, fmt::format("expected str, got {}", v.type_name()));
    return v.as_string();
  }
  bool boolean(const PyValue& v, const Path& path) const {
    if (v.is_bool()) return v.as_bool();
    if (v.is_int()) return u64(v, path) != 0;
    fail(path, fmt::format("expected bool, got {}", v.type_name()));
  }

  BlockSnapshot read_block(const PyValue& b, const Path& path, std::uintptr_t* next_addr) {
    charge(sizeof(BlockSnapshot), path);
    BlockSnapshot out;
    if (!b.is_dict()) fail(path, fmt::format("expected dict, got {}", b.type_name()));
    out.size = size_field(b, "size", path, true);
    // Legacy snapshots may omit the block address: blocks tile their segment in order.
    out.address = b.get("address") != nullptr ? static_cast<std::uintptr_t>(u64_field(b, "address", path))
                                              : *next_addr;
    *next_addr = out.address + out.size;
    out.requested_size = size_field(b, "requested_size", path, false);
    out.state = str(required(b, "state", path), path / "state");
    charge(out.state.size(), path);
    return out;
  }

  SegmentSnapshot read_segment(const PyValue& s, const Path& path) {
    charge(sizeof(SegmentSnapshot), path);
    if (!s.is_dict()) fail(path, fmt::format("expected dict, got {}", s.type_name()));
    SegmentSnapshot out;
    if (const PyValue* d = s.get("device"); d != nullptr && !d->is_none()) {
      const std::int64_t device = d->is_int() ? meta_i64(*d, path / "device", -1) : -1;
      out.device = device >= INT_MIN && device <= INT_MAX ? static_cast<int>(device) : -1;
    }
    out.address = static_cast<std::uintptr_t>(u64(required(s, "address", path), path / "address"));
    out.total_size = size_field(s, "total_size", path, true);
    out.allocated_size = size_field(s, "allocated_size", path, false);
    out.active_size = size_field(s, "active_size", path, false);
    out.requested_size = size_field(s, "requested_size", path, false);
    if (const PyValue* st = s.get("stream"); st != nullptr && st->is_int())
      out.stream = static_cast<std::uintptr_t>(id_u64(*st, path / "stream"));
    if (const PyValue* t = s.get("segment_type")) out.segment_type = str(*t, path / "segment_type");
    else out.segment_type = "large";
    if (const PyValue* e = s.get("is_expandable")) out.is_expandable = boolean(*e, path / "is_expandable");
    if (const PyValue* t = s.get("tag"); t != nullptr && t->is_string()) out.tag = str(*t, path / "tag");
    if (const PyValue* z = s.get("sleeping")) out.sleeping = boolean(*z, path / "sleeping");
    out.spilled_bytes = size_field(s, "spilled_bytes", path, false);
    const Path bpath = path / "blocks";
    const auto& blocks = list(required(s, "blocks", path), bpath);
    std::uintptr_t next = out.address;
    out.blocks.reserve(blocks.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) out.blocks.push_back(read_block(blocks[i], bpath[i], &next));
    return out;
  }

  // A frame is metadata: whatever a field holds, the frame is kept ("??" and no line for what
  // is not a string or an int that fits).
  std::string read_frame(const PyValue& f, const Path& path) {
    if (f.is_string()) return f.as_string();
    if (!f.is_dict()) fail(path, fmt::format("expected dict, got {}", f.type_name()));
    const PyValue* name = f.get("name");
    const PyValue* file = f.get("filename");
    const PyValue* line = f.get("line");
    static const std::string kUnknown = "??";
    const std::string& n = name != nullptr && name->is_string() ? name->as_string() : kUnknown;
    const std::string& filename = file != nullptr && file->is_string() ? file->as_string() : kUnknown;
    const std::int64_t l = line != nullptr && line->is_int() ? meta_i64(*line, path / "line", 0) : 0;
    std::string out;
    out.reserve(n.size() + filename.size() + 16);
    out += n;
    out += " (";
    out += filename;
    if (l != 0) {
      out += ':';
      out += std::to_string(l);
    }
    out += ')';
    return out;
  }

  void read_traces(const PyValue& traces, Snapshot& snap, const Path& tpath) {
    const auto& devices = list(traces, tpath);
    snap.device_traces.resize(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const Path dpath = tpath[d];
      const auto& entries = list(devices[d], dpath);
      auto& out = snap.device_traces[d];
      out.reserve(entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const Path path = dpath[i];
        const PyValue& e = entries[i];
        charge(sizeof(TraceEntry), path);
        const std::string& action = str(required(e, "action", path), path / "action");
        TraceEntry t;
        if (!parse_trace_action(action, &t.action)) {
          if (strict_) fail(path / "action", fmt::format("unknown action '{}'", action));
          continue;
        }
        t.addr = static_cast<std::uintptr_t>(
            u64_field(e, t.action == TraceAction::oom && e.get("device_free") ? "device_free" : "addr", path));
        t.size = static_cast<std::size_t>(u64_field(e, "size", path));
        if (const PyValue* st = e.get("stream"); st != nullptr && st->is_int())
          t.stream = static_cast<std::uintptr_t>(id_u64(*st, path / "stream"));
        if (const PyValue* time = e.get("time_us"); time != nullptr && time->is_int()) {
          t.time_us = meta_i64(*time, path / "time_us", 0);
        } else if (time != nullptr && time->is_float() && std::isfinite(time->as_float()) &&
                   std::abs(time->as_float()) < 9.0e18) {
          t.time_us = static_cast<std::int64_t>(time->as_float());
        }
        if (const PyValue* frames = e.get("frames"); frames_ && frames != nullptr && !frames->is_none()) {
          const Path fpath = path / "frames";
          const auto& fl = list(*frames, fpath);
          t.frames.reserve(fl.size());
          for (std::size_t k = 0; k < fl.size(); ++k) {
            t.frames.push_back(read_frame(fl[k], fpath[k]));
            charge(sizeof(std::string) + t.frames.back().size(), fpath);
          }
        }
        out.push_back(std::move(t));
      }
    }
  }

  // The settings are what the recording ran with; a field this reader does not understand is
  // left at PyTorch's default rather than refusing the whole snapshot.
  void read_settings(const PyValue& s, Snapshot& snap, const Path& path) {
    if (!s.is_dict()) return;
    snap.has_settings = true;
    snap.max_split_size = SIZE_MAX;  // PyTorch's default when the key is absent
    if (const PyValue* v = s.get("PYTORCH_CUDA_ALLOC_CONF"); v && v->is_string()) snap.settings = v->as_string();
    if (const PyValue* v = s.get("max_split_size"); v && v->is_int() && !v->is_big() && !v->is_wide()) {
      const std::int64_t m = v->as_int();
      snap.max_split_size = m < 0 ? SIZE_MAX : static_cast<std::size_t>(m);
    }
    if (const PyValue* v = s.get("garbage_collection_threshold"); v && (v->is_float() || v->is_int()))
      snap.garbage_collection_threshold = v->as_float();
    if (const PyValue* v = s.get("expandable_segments"); v && (v->is_bool() || v->is_int()))
      snap.expandable_segments = boolean(*v, path / "expandable_segments");
    if (const PyValue* v = s.get("roundup_power2_divisions")) {
      auto divisions = [](const PyValue& d) -> std::uint32_t {
        return d.is_int() && !d.is_big() && !d.is_wide() && d.as_int() >= 0 && d.as_int() <= 1024
                   ? static_cast<std::uint32_t>(d.as_int())
                   : 0;
      };
      snap.roundup_power2_divisions.clear();
      if (v->is_dict()) {
        // {"1": d, "2": d, "4": d, ..., "32768": d}: the key is the interval's lower bound in MiB.
        for (const auto& [k, d] : v->entries()) {
          if (!k.is_string()) continue;
          const std::string& key = k.as_string();
          std::uint64_t mb = 0;
          auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), mb);
          if (ec != std::errc() || p != key.data() + key.size() || mb == 0 || !std::has_single_bit(mb) ||
              std::bit_width(mb) > 16)
            continue;
          const auto index = static_cast<std::size_t>(std::bit_width(mb) - 1);
          if (snap.roundup_power2_divisions.size() <= index) snap.roundup_power2_divisions.resize(index + 1, 0);
          snap.roundup_power2_divisions[index] = divisions(d);
        }
      } else if (v->is_list() || v->is_tuple()) {
        for (const PyValue& d : v->items()) snap.roundup_power2_divisions.push_back(divisions(d));
      }
    }
  }

  std::string_view name_;
  bool strict_;
  bool frames_;
  std::size_t budget_;
  std::size_t used_ = 0;
};

}  // namespace

Snapshot snapshot_from_pyvalue(const PyValue& root, std::string_view name, const SnapshotReadOptions& options) {
  return Converter(name, options).run(root);
}

Snapshot read_snapshot_file(const std::string& path, const SnapshotReadOptions& options) {
  return snapshot_from_pyvalue(read_pickle_file(path, options.limits), path, options);
}

}  // namespace stitch::formats
