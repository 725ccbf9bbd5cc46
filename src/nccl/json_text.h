// JSON text for the control API's answers (Python reads them with json.loads).
#pragma once

#include <string>

namespace amem::nccl {

// `text` as a JSON string literal, quotes included. Control characters become
// spaces: the messages are for people, and one line each.
inline std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
  }
  return out + "\"";
}

}  // namespace amem::nccl
