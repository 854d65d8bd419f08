// core/nearest.h: "did you mean" suggestions for unknown flags, commands and YAML keys.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Nearest candidate by edit distance; empty when nothing is close.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace tandem
