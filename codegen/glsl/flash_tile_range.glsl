  {  // $A over the tile's queries, its keys, or its one element
    uint row = $ROW, col = $COL;
    if (row == 0u || col == 0u) {
      uint first = row != 0u ? qa : col != 0u ? ka : 0u, count = row != 0u ? qb - qa + 1u : col != 0u ? kb - ka + 1u : 1u;
      for (uint x = lid; x < count; x += INV) range_add(slot * $Ku + $Iu, $A[$AT + (first + x) * (row + col)]);
    }
  }
