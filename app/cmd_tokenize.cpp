// trident tokenize [--tokenizer FILE] [--decode] [--lines]: text on standard input -> token
// ids on standard output (space-separated, one line), or with --decode ids -> text. With
// --lines each input line (its newline left out) is a text of its own: one line of ids per
// line of text, and with --decode one line of text per line of ids. Without --tokenizer, the
// byte-level vocabulary (token = byte value). Rank 0 alone reads and writes.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string_view>
#include <sstream>

#include "commands.hpp"
#include "tokenizer/bpe_tokenizer.hpp"
#include "util/error.hpp"

namespace trident {

void add_tokenize_command(CLI::App& app, TokenizeOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Text on stdin -> token ids on stdout (or ids -> text with --decode)");
  cmd->add_option("--tokenizer", options.tokenizer,
                  "Hugging Face tokenizer.json (byte-level BPE); default: byte-level, ids 0..255");
  cmd->add_flag("--decode", options.decode, "read token ids, write the text they stand for");
  cmd->add_flag("--lines", options.lines,
                "each line is a text of its own (without its newline): one output line each");
}

namespace {

std::string read_stdin() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) throw Error("cannot read standard input");
  return text;
}

// Whitespace-separated decimal ids; anything else is refused, naming the word.
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    // The whole word, NUL bytes included (strtoll stopped at a NUL: "65\0" "66" read as 65).
    int32_t id = 0;
    const char* end = word.data() + word.size();
    const auto r = std::from_chars(word.data(), end, id, 10);
    if (r.ec != std::errc() || r.ptr != end || id < 0)
      throw Error("standard input: '" + printable_line(word) + "' is not a token id");
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

void run_tokenize(const TokenizeOptions& options) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  const BpeTokenizer tokenizer = options.tokenizer.empty()
                                     ? BpeTokenizer::bytes()
                                     : BpeTokenizer::from_file(options.tokenizer);
  const std::string input = read_stdin();
  std::vector<std::string_view> texts;
  if (!options.lines) {
    texts.push_back(input);
  } else {
    for (size_t begin = 0; begin < input.size();) {
      const size_t end = std::min(input.find('\n', begin), input.size());
      texts.push_back(std::string_view(input).substr(begin, end - begin));
      begin = end + 1;
    }
  }
  std::string out;
  for (const std::string_view text : texts) {
    if (options.decode) {
      out += tokenizer.decode(parse_ids(std::string(text)));
    } else {
      bool first = true;
      for (const int32_t id : tokenizer.encode(text)) {
        if (!first) out += ' ';
        out += std::to_string(id);
        first = false;
      }
    }
    if (options.lines || !options.decode) out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw Error("writing to standard output failed");
}

}  // namespace trident
