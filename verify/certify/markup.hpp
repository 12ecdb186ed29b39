// Escaping for XML and HTML text and attribute values (certify's JUnit
// XML, report's HTML): & < > and the double quote.
#pragma once

#include <string>
#include <string_view>

namespace accumcheck {

inline std::string xml_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o.append("&lt;");
        break;
      case '>':
        o.append("&gt;");
        break;
      case '&':
        o.append("&amp;");
        break;
      case '"':
        o.append("&quot;");
        break;
      default:
        o.push_back(c);
    }
  }
  return o;
}

}  // namespace accumcheck
