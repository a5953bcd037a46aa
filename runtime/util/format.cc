#include "runtime/util/format.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kolo {
namespace {

// `value` with three significant digits, trailing zeros dropped.
std::string ThreeDigits(double value) {
  const int whole_digits =
      value >= 1 ? static_cast<int>(std::floor(std::log10(value))) + 1 : 1;
  const int decimals = std::max(0, 3 - whole_digits);
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  std::string text(buffer);
  if (text.find('.') != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
  }
  return text;
}

}  // namespace

std::string FormatSeconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "forever";
  if (d < absl::ZeroDuration()) return absl::StrCat("-", FormatSeconds(-d));
  if (d == absl::ZeroDuration()) return "0 s";
  const double seconds = absl::ToDoubleSeconds(d);
  // Rounding may carry into the next unit (999.7 ms is "1 s").
  if (seconds >= 0.9995) return absl::StrCat(ThreeDigits(seconds), " s");
  if (seconds >= 0.0009995) {
    return absl::StrCat(ThreeDigits(seconds * 1e3), " ms");
  }
  return absl::StrCat(ThreeDigits(seconds * 1e6), " us");
}

}  // namespace kolo
