// config/keys.hpp — the configuration keys, written down once: name, whether the key is fixed
// once an allocator exists, the accepted values, how its value is parsed and printed. The table
// drives Config::parse, Config::to_string, Allocator::configure's fixed-key rule and the error
// messages.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "stitch/config.hpp"

namespace stitch::detail {

class ConfigParser;

/// One key of STITCH_ALLOC_CONF.
struct KeySpec {
  std::string_view name;
  /// Fixed once the allocator exists (it chooses or sizes the backend); tunable otherwise.
  bool fixed;
  std::string_view accepted;  ///< the accepted values, as error messages state them
  /// Reads the key's value (the tokens after `name:`) into the config; throws config_error.
  void (*parse)(ConfigParser& parser, Config& config, const KeySpec& key);
  /// The value as parse() accepts it; "" when the key is left out of to_string() (its default
  /// says nothing, or it does not apply).
  std::string (*print)(const Config& config);
};

/// Every key, in the order to_string() prints them.
std::span<const KeySpec> config_keys() noexcept;

/// The key named `name`; nullptr if there is none.
const KeySpec* find_config_key(std::string_view name) noexcept;

}  // namespace stitch::detail
