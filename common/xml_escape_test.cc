#include "common/xml_escape.h"

#include <gtest/gtest.h>

namespace pp {
namespace {

TEST(XmlEscapeTest, EscapesTheFivePredefinedEntitiesOnly) {
  EXPECT_EQ(XmlEscape("a < b && c > \"d\" 'e'"),
            "a &lt; b &amp;&amp; c &gt; &quot;d&quot; &apos;e&apos;");
  EXPECT_EQ(XmlEscape("zb_h1 p=4 m=8 \xc3\xa9"), "zb_h1 p=4 m=8 \xc3\xa9");
  EXPECT_EQ(XmlEscape(""), "");
}

}  // namespace
}  // namespace pp
