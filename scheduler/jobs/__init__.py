"""Jobs as users make and change them: submitting, arrays, what users ask (operations), the
audit trail (events) and stored output (logs)."""
