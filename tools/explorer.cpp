#include "tools/explorer.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "tools/explorer_page.hpp"  // generated from tools/explorer.html: kExplorerPage

namespace qkv::tool {

std::string explorer_html(const Explorer& e) {
  nlohmann::json data = {{"title", e.title}, {"backend", e.backend}, {"tokens", e.tokens}, {"layers", nlohmann::json::array()}};
  for (const ExplorerLayer& l : e.layers) {
    nlohmann::json weights = nlohmann::json::array();
    for (double w : l.weights) weights.push_back(std::round(w * 1e5) / 1e5);  // five decimals: what a reader can tell apart
    data["layers"].push_back({{"name", l.name}, {"heads", l.heads}, {"rows", l.rows}, {"cols", l.cols}, {"weights", std::move(weights)}});
  }
  // Inline in a <script> element: "</" would end it early, so it is written as "<\/" (the same
  // string to JSON).
  std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  for (std::size_t at = 0; (at = json.find("</", at)) != std::string::npos; at += 3) json.replace(at, 2, "<\\/");
  std::string page(kExplorerPage);
  const std::string slot = "/*QKV_DATA*/{}";
  page.replace(page.find(slot), slot.size(), json);
  return page;
}

}  // namespace qkv::tool
