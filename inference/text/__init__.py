"""Text around a model's answers: the one prompt path through a model's chat template
(prompting), thinking blocks and their switch (thinking), and structured output: JSON schemas
as GBNF grammars for the engine (structured)."""
