// Text for SVG and other XML: the five predefined entities escaped, so the
// result is safe in element content and in quoted attribute values alike.
// The one copy for the SVG writers (loss curves, schedule timelines, traces).
#ifndef COMMON_XML_ESCAPE_H_
#define COMMON_XML_ESCAPE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace pp {

// "&" -> "&amp;", "<" -> "&lt;", ">" -> "&gt;", '"' -> "&quot;",
// "'" -> "&apos;"; every other byte as it is.
std::string XmlEscape(absl::string_view text);

}  // namespace pp

#endif  // COMMON_XML_ESCAPE_H_
