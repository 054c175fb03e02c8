#include "cli_numbers.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace trident {
namespace {

// `text` whole as a number of type T (decimal for integers, "nan"/"inf" refused for floats).
template <class T>
bool parse_whole(const std::string& text, T& value) {
  if constexpr (std::is_integral_v<T>) {
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, value, 10);
    return r.ec == std::errc() && r.ptr == end;
  } else {
    char* end = nullptr;
    value = std::strtod(text.c_str(), &end);
    return !text.empty() && end == text.c_str() + text.size() && std::isfinite(value);
  }
}

// A whole number in decimal that int64 cannot hold.
bool out_of_range(const std::string& text) {
  int64_t v = 0;
  return std::from_chars(text.data(), text.data() + text.size(), v, 10).ec ==
         std::errc::result_out_of_range;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// A check with no description, so that --help shows the option as before.
CLI::Validator quiet(std::function<std::string(std::string&)> check) {
  return CLI::Validator(std::move(check), "", "");
}

}  // namespace

CLI::Validator whole_number(int64_t min, int64_t max) {
  const std::string wanted = max == std::numeric_limits<int64_t>::max()
                                 ? "a whole number >= " + std::to_string(min)
                                 : "a whole number in [" + std::to_string(min) + ", " +
                                       std::to_string(max) + "]";
  return quiet([=](std::string& text) -> std::string {
    int64_t v = 0;
    if (parse_whole(text, v) && v >= min && v <= max) return "";
    return "must be " + wanted + ", got " + text + (out_of_range(text) ? " (beyond 64 bits)" : "");
  });
}

CLI::Validator finite_number(double min, double max) {
  const std::string wanted =
      max == std::numeric_limits<double>::max()
          ? "a number >= " + number_text(min)
          : "a number in [" + number_text(min) + ", " + number_text(max) + "]";
  return quiet([=](std::string& text) -> std::string {
    double v = 0;
    if (!parse_whole(text, v) || v < min || v > max) return "must be " + wanted + ", got " + text;
    return "";
  });
}

void check_number_types(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type == "INT" || type == "UINT") {
      // First of all (transform puts it in front): the text rewritten as the plain decimal it
      // reads as ("010" -> "10"). CLI11's own conversion reads a leading 0 as octal (--nodes
      // 010 planned 8 nodes), so it must only see decimal text; what is no decimal number stays
      // as it was, for the checks below to refuse.
      option->transform(quiet([type](std::string& text) -> std::string {
        int64_t v = 0;
        uint64_t u = 0;
        if (type == "INT" ? parse_whole(text, v) : parse_whole(text, u))
          text = type == "INT" ? std::to_string(v) : std::to_string(u);
        return "";
      }));
    }
    if (type == "INT") {
      option->check(quiet([](std::string& text) -> std::string {
        int64_t v = 0;
        if (parse_whole(text, v)) return "";
        return "must be a whole number, got " + text +
               (out_of_range(text) ? " (beyond 64 bits)" : "");
      }));
    } else if (type == "UINT") {
      option->check(quiet([](std::string& text) -> std::string {
        uint64_t v = 0;
        return parse_whole(text, v) ? "" : "must be a whole number >= 0 (64 bits), got " + text;
      }));
    } else if (type == "FLOAT") {
      option->check(quiet([](std::string& text) -> std::string {
        double v = 0;
        return parse_whole(text, v) ? "" : "must be a finite number, got " + text;
      }));
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) check_number_types(*sub);
}

void refuse_empty_text(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_type_name().rfind("TEXT", 0) != 0) continue;
    option->check(quiet([](std::string& text) -> std::string {
      return text.empty() ? "must not be empty" : "";
    }));
  }
  for (CLI::App* sub : app.get_subcommands({})) refuse_empty_text(*sub);
}

}  // namespace trident
