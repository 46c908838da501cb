// Row `row` of $A lies in the page its block table names for row / ${A}_PAGE, at the head's rows
// there: false (the row reads zeros) where the entry names no page of the pool.
bool row_at_$A(uint row, out uint at) {
  float page = ${A}TABLE[$TAB + row / ${A}_PAGE];
  at = 0u;
  if (!(page >= 0.0 && page < float(${A}_POOL))) return false;
  at = uint(page) * ${A}_PAGE_ELEMS + $AT + (row % ${A}_PAGE) * $RS;
  return true;
}
