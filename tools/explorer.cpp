#include "tools/explorer.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "tools/explorer_page.hpp"  // generated from tools/explorer.html: kExplorerPage

namespace qkv::tool {

std::string explorer_html(const Explorer& e) {
  nlohmann::json data = {{"title", e.title}, {"backend", e.backend}, {"tokens", e.tokens}, {"layers", nlohmann::json::array()}};
  for (const ExplorerLayer& l : e.layers) {
    nlohmann::json weights = nlohmann::json::array();
    for (double w : l.weights)  // five decimals, what a reader can tell apart; NaN and infinities as null (JSON has neither)
      weights.push_back(std::isfinite(w) ? nlohmann::json(std::round(w * 1e5) / 1e5) : nlohmann::json(nullptr));
    data["layers"].push_back({{"name", l.name}, {"heads", l.heads}, {"rows", l.rows}, {"cols", l.cols}, {"weights", std::move(weights)}});
  }
  // Inline in a <script> element, where "</script" or "<!--" in a string would end it or change
  // how the HTML parser reads it: every <, > and & is written as its JSON escape (the same string
  // to JSON.parse). Labels that are not valid UTF-8 get U+FFFD.
  std::string json;
  for (char c : data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
    json += c == '<' ? std::string("\\u003c") : c == '>' ? std::string("\\u003e") : c == '&' ? std::string("\\u0026") : std::string(1, c);
  std::string page(kExplorerPage);
  const std::string slot = "/*QKV_DATA*/{}";
  page.replace(page.find(slot), slot.size(), json);
  return page;
}

}  // namespace qkv::tool
