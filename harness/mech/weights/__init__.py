"""Weight evidence: head weights and composition and copying scores (`scores`), the scores in
factored form (`factored`), the rotation null (`null`), every pair's score and decision (`table`:
`harness weights`), and what flows through one route (`explain`)."""
