// diagnostics/pickle_writer.cpp — the protocol-4 pickle writer (see pickle_writer.hpp).
#include "diagnostics/pickle_writer.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "stitch/errors.hpp"

namespace stitch::detail {

namespace {

// Opcodes (names as in Python's pickletools).
constexpr std::uint8_t kMark = '(';
constexpr std::uint8_t kStop = '.';
constexpr std::uint8_t kNone = 'N';
constexpr std::uint8_t kNewTrue = 0x88;
constexpr std::uint8_t kNewFalse = 0x89;
constexpr std::uint8_t kBinInt = 'J';
constexpr std::uint8_t kBinInt1 = 'K';
constexpr std::uint8_t kBinInt2 = 'M';
constexpr std::uint8_t kLong1 = 0x8a;
constexpr std::uint8_t kLong4 = 0x8b;
constexpr std::uint8_t kBinFloat = 'G';
constexpr std::uint8_t kShortBinUnicode = 0x8c;
constexpr std::uint8_t kBinUnicode = 'X';
constexpr std::uint8_t kShortBinBytes = 'C';
constexpr std::uint8_t kBinBytes = 'B';
constexpr std::uint8_t kEmptyList = ']';
constexpr std::uint8_t kEmptyDict = '}';
constexpr std::uint8_t kEmptyTuple = ')';
constexpr std::uint8_t kAppends = 'e';
constexpr std::uint8_t kSetItems = 'u';
constexpr std::uint8_t kTuple = 't';
constexpr std::uint8_t kTuple1 = 0x85;
constexpr std::uint8_t kMemoize = 0x94;
constexpr std::uint8_t kBinGet = 'h';
constexpr std::uint8_t kLongBinGet = 'j';
constexpr std::uint8_t kProto = 0x80;
constexpr std::uint8_t kFrame = 0x95;

constexpr std::size_t kFrameTarget = 64 * 1024;  // Python's _FRAME_SIZE_TARGET
constexpr std::uint32_t kBatch = 1000;           // Python's _BATCHSIZE

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is invalid.
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t min = 0;
  std::uint32_t cp = 0;
  if ((c0 & 0xe0) == 0xc0) {
    n = 2, min = 0x80, cp = c0 & 0x1f;
  } else if ((c0 & 0xf0) == 0xe0) {
    n = 3, min = 0x800, cp = c0 & 0x0f;
  } else if ((c0 & 0xf8) == 0xf0) {
    n = 4, min = 0x10000, cp = c0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

}  // namespace

bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

PickleWriter::PickleWriter() {
  out_.push_back(static_cast<char>(kProto));
  out_.push_back(4);
  open_frame();
}

void PickleWriter::open_frame() {
  frame_header_ = out_.size();
  out_.push_back(static_cast<char>(kFrame));
  out_.append(8, '\0');
}

void PickleWriter::close_frame() {
  std::uint64_t n = out_.size() - frame_header_ - 9;
  for (int i = 0; i < 8; ++i) {
    out_[frame_header_ + 1 + static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
    n >>= 8;
  }
}

void PickleWriter::op(std::uint8_t code) {
  // Frames end only between opcodes.
  if (out_.size() - frame_header_ - 9 >= kFrameTarget) {
    close_frame();
    open_frame();
  }
  out_.push_back(static_cast<char>(code));
}

void PickleWriter::raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }

void PickleWriter::begin_item() {
  if (levels_.empty()) {
    if (started_) throw error("PickleWriter: a pickle holds one top-level value");
    started_ = true;
    return;
  }
  Level& l = levels_.back();
  if (l.kind == Kind::list && l.batch == 0) op(kMark);
  if (l.kind == Kind::dict && !l.want_value && l.batch == 0) op(kMark);
}

void PickleWriter::end_item() {
  if (levels_.empty()) {
    done_ = true;
    return;
  }
  Level& l = levels_.back();
  if (l.kind == Kind::list) {
    if (++l.batch == kBatch) {
      op(kAppends);
      l.batch = 0;
    }
  } else if (l.kind == Kind::dict) {
    if (!l.want_value) {
      l.want_value = true;
    } else {
      l.want_value = false;
      if (++l.batch == kBatch) {
        op(kSetItems);
        l.batch = 0;
      }
    }
  }
}

void PickleWriter::get(std::uint32_t index) {
  if (index < 256) {
    op(kBinGet);
    out_.push_back(static_cast<char>(index));
  } else {
    op(kLongBinGet);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((index >> (8 * i)) & 0xff));
  }
}

void PickleWriter::memoize_pending() {
  if (pending_node_ != nullptr) {
    op(kMemoize);
    nodes_.emplace(pending_node_, memo_count_++);
    pending_node_ = nullptr;
  }
  if (!has_pending_share_) return;
  op(kMemoize);
  shared_.emplace(std::move(pending_share_), memo_count_++);
  pending_share_.clear();
  has_pending_share_ = false;
}

bool PickleWriter::reuse(std::string_view id) {
  if (auto it = shared_.find(id); it != shared_.end()) {
    begin_item();
    get(it->second);
    end_item();
    return true;
  }
  pending_share_.assign(id.data(), id.size());
  has_pending_share_ = true;
  return false;
}

void PickleWriter::begin_dict() {
  begin_item();
  op(kEmptyDict);
  memoize_pending();
  levels_.push_back({Kind::dict});
}

void PickleWriter::end_dict() {
  if (levels_.empty() || levels_.back().kind != Kind::dict) throw error("PickleWriter: end_dict without begin_dict");
  if (levels_.back().want_value) throw error("PickleWriter: dict key without a value");
  if (levels_.back().batch > 0) op(kSetItems);
  levels_.pop_back();
  end_item();
}

void PickleWriter::begin_list() {
  begin_item();
  op(kEmptyList);
  memoize_pending();
  levels_.push_back({Kind::list});
}

void PickleWriter::end_list() {
  if (levels_.empty() || levels_.back().kind != Kind::list) throw error("PickleWriter: end_list without begin_list");
  if (levels_.back().batch > 0) op(kAppends);
  levels_.pop_back();
  end_item();
}

void PickleWriter::begin_tuple() {
  begin_item();
  has_pending_share_ = false;  // tuples are not shared
  op(kMark);
  levels_.push_back({Kind::tuple});
}

void PickleWriter::end_tuple() {
  if (levels_.empty() || levels_.back().kind != Kind::tuple) throw error("PickleWriter: end_tuple without begin_tuple");
  op(kTuple);
  levels_.pop_back();
  end_item();
}

void PickleWriter::none() {
  begin_item();
  op(kNone);
  end_item();
}

void PickleWriter::boolean(bool v) {
  begin_item();
  op(v ? kNewTrue : kNewFalse);
  end_item();
}

void PickleWriter::integer(std::int64_t v) {
  if (v >= 0) {
    uinteger(static_cast<std::uint64_t>(v));
    return;
  }
  begin_item();
  if (v >= INT32_MIN) {
    op(kBinInt);
    const auto u = static_cast<std::uint32_t>(static_cast<std::int32_t>(v));
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  } else {
    // Python's encode_long: (bit_length >> 3) + 1 bytes of two's complement, minus a redundant
    // 0xff sign byte.
    const std::uint64_t magnitude = ~static_cast<std::uint64_t>(v) + 1;
    std::size_t n = static_cast<std::size_t>(std::bit_width(magnitude) >> 3) + 1;
    if (n > 8) n = 8;
    auto u = static_cast<std::uint64_t>(v);
    unsigned char b[8];
    for (std::size_t i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>((u >> (8 * i)) & 0xff);
    if (n > 1 && b[n - 1] == 0xff && (b[n - 2] & 0x80) != 0) --n;
    op(kLong1);
    out_.push_back(static_cast<char>(n));
    raw(b, n);
  }
  end_item();
}

void PickleWriter::uinteger(std::uint64_t v) {
  begin_item();
  if (v <= 0xff) {
    op(kBinInt1);
    out_.push_back(static_cast<char>(v));
  } else if (v <= 0xffff) {
    op(kBinInt2);
    out_.push_back(static_cast<char>(v & 0xff));
    out_.push_back(static_cast<char>(v >> 8));
  } else if (v <= 0x7fffffff) {
    op(kBinInt);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  } else {
    // (bit_length >> 3) + 1 bytes, so the top bit is a 0 sign bit (9 bytes above 2^63 - 1).
    const std::size_t n = static_cast<std::size_t>(std::bit_width(v) >> 3) + 1;
    op(kLong1);
    out_.push_back(static_cast<char>(n));
    for (std::size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>(i < 8 ? (v >> (8 * i)) & 0xff : 0));
  }
  end_item();
}

void PickleWriter::wide_integer(const PyValue& v) {
  const std::string& bytes = v.long_bytes();
  begin_item();
  if (bytes.size() <= 0xff) {
    op(kLong1);
    out_.push_back(static_cast<char>(bytes.size()));
  } else {
    op(kLong4);
    const auto n = static_cast<std::uint32_t>(bytes.size());
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  }
  out_ += bytes;
  end_item();
}

void PickleWriter::floating(double v) {
  begin_item();
  op(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(v);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  end_item();
}

void PickleWriter::string(std::string_view v) {
  if (!valid_utf8(v)) {
    const std::string clean = sanitize_utf8(v);
    string(clean);
    return;
  }
  begin_item();
  if (auto it = strings_.find(v); it != strings_.end()) {
    get(it->second);
  } else {
    if (v.size() < 256) {
      op(kShortBinUnicode);
      out_.push_back(static_cast<char>(v.size()));
    } else if (v.size() <= 0xffffffffu) {
      op(kBinUnicode);
      for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v.size() >> (8 * i)) & 0xff));
    } else {
      throw error("PickleWriter: strings of 4 GiB and more are not supported");
    }
    raw(v.data(), v.size());
    op(kMemoize);
    strings_.emplace(std::string(v), memo_count_++);
  }
  end_item();
}

void PickleWriter::bytes(std::string_view v) {
  begin_item();
  if (v.size() < 256) {
    op(kShortBinBytes);
    out_.push_back(static_cast<char>(v.size()));
  } else if (v.size() <= 0xffffffffu) {
    op(kBinBytes);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v.size() >> (8 * i)) & 0xff));
  } else {
    throw error("PickleWriter: bytes of 4 GiB and more are not supported");
  }
  raw(v.data(), v.size());
  end_item();
}

bool PickleWriter::shared_node(const PyValue& v) {
  if (!v.node()->shared) return false;
  if (auto it = nodes_.find(v.node()); it != nodes_.end()) {
    begin_item();
    get(it->second);
    end_item();
    return true;
  }
  pending_node_ = v.node();  // memoized by the begin_list/begin_dict that follows
  return false;
}

void PickleWriter::value(const PyValue& v) {
  if (write_scalar(*this, v)) return;
  switch (v.type()) {
    case PyValue::Type::list:
      if (shared_node(v)) return;
      begin_list();
      for (const PyValue& c : v.items()) value(c);
      end_list();
      return;
    case PyValue::Type::tuple: {
      // As Python does: EMPTY_TUPLE, TUPLE1..3 for short tuples, MARK ... TUPLE otherwise.
      const auto& items = v.items();
      if (items.size() > 3) {
        begin_tuple();
        for (const PyValue& c : items) value(c);
        end_tuple();
        return;
      }
      begin_item();
      if (items.empty()) {
        op(kEmptyTuple);
      } else {
        // The items are written as values of a tuple level, then TUPLEn collapses them.
        levels_.push_back({Kind::tuple});
        for (const PyValue& c : items) value(c);
        levels_.pop_back();
        op(static_cast<std::uint8_t>(kTuple1 + items.size() - 1));
      }
      end_item();
      return;
    }
    case PyValue::Type::dict:
      if (shared_node(v)) return;
      begin_dict();
      for (const auto& [k, c] : v.entries()) {
        value(k);
        value(c);
      }
      end_dict();
      return;
    default:  // scalars: written above
      return;
  }
}

std::string PickleWriter::finish() {
  if (!levels_.empty()) throw error("PickleWriter: finish() with an open container");
  if (!done_) throw error("PickleWriter: finish() before a value was written");
  op(kStop);
  close_frame();
  std::string out = std::move(out_);
  out_.clear();
  return out;
}

}  // namespace stitch::detail
